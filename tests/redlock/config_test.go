package redlock_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// A program opens a URL with its own clients, Logger and Options through a
// mux of its own; the clients are not dialled from the URL, nor closed
// with the Locker. One of the three nodes is down: the backend says so on
// the program's Logger, and a majority still grants the lock.
func TestOpenURLWithOwnClients(t *testing.T) {
	up := clients(t, addrs(servers.Redis(t, 5)[:2]))
	down := goredis.NewClient(&goredis.Options{Addr: closedAddr(t), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer down.Close()
	rec := &conformance.LogRecorder{}
	prefix := "own-" + uniqueKey(t) + ":"
	var mux driver.URLMux
	mux.RegisterLocker("redlock", &redlock.URLOpener{
		Clients: []goredis.UniversalClient{up[0], up[1], down},
		Options: redlock.Options{NodeTimeout: testNodeTimeout, Locker: &dlock.Options{Logger: slog.New(rec), TTL: time.Minute}},
	})
	l, err := mux.OpenLocker(t.Context(), "redlock://n1,n2,n3?ttl=5s&prefix="+prefix)
	if err != nil {
		t.Fatalf("OpenLocker: %v", err)
	}
	if !rec.Contains("did not take the scripts") {
		t.Errorf("the node that is down was not reported on the Options' Logger")
	}
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if le.TTL() != 5*time.Second {
		t.Errorf("TTL %v; want the URL's 5s over the Options' 1m", le.TTL())
	}
	if n, err := up[0].Exists(t.Context(), prefix+"{"+key+"}").Result(); err != nil || n != 1 {
		t.Errorf("the lock under the URL's prefix: exists %d, %v; want 1", n, err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := up[0].Ping(t.Context()).Err(); err != nil {
		t.Errorf("the program's client after Close: %v; want it open", err)
	}
}

// New refuses bad opts.Locker before any I/O.
func TestNewRejectsBadLockerOptionsBeforeIO(t *testing.T) {
	cs := clients(t, []string{closedAddr(t), closedAddr(t), closedAddr(t)})
	for name, lo := range map[string]dlock.Options{
		"negative retry":  {RetryMin: -time.Millisecond},
		"TTL below floor": {TTL: time.Millisecond},
		"drift factor":    {DriftFactor: 0.7},
	} {
		rec := &conformance.LogRecorder{}
		lo.Logger = slog.New(rec)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		l, err := redlock.New(ctx, cs, &redlock.Options{Locker: &lo})
		cancel()
		if l != nil {
			_ = l.Close()
		}
		if !errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("%s: New = %v; want ErrInvalidConfig or ErrInvalidTTL", name, err)
		}
		if rec.Contains("did not take the scripts") {
			t.Errorf("%s: New tried the nodes; want no I/O", name)
		}
	}
}
