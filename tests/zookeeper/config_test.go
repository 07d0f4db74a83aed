package zookeeper_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// A program opens a URL through a mux of its own, with its own Logger and
// Options; a normal Close logs nothing above Debug (it used to log
// "disconnected; leases are uncertain" at Warn).
func TestOpenURLWithOwnLoggerAndOptions(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	rec := &conformance.LogRecorder{}
	prefix := "/own-" + strings.ReplaceAll(uniqueKey(t), ".", "-")
	var mux driver.URLMux
	mux.RegisterLocker("zk", &zookeeper.URLOpener{Options: zookeeper.Options{
		SessionTimeout: testSession,
		Prefix:         prefix,
		Locker:         &dlock.Options{Logger: slog.New(rec), TTL: 20 * time.Second},
	}})
	l, err := mux.OpenLocker(t.Context(), "zk://"+strings.Join(srv, ",")+"?ttl=15s")
	if err != nil {
		t.Fatalf("OpenLocker: %v", err)
	}
	le, err := l.Acquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if le.TTL() != 15*time.Second {
		t.Errorf("TTL %v; want the URL's 15s over the Options' 20s", le.TTL())
	}
	if ok, _, err := adminConn(t, srv).Exists(prefix); err != nil || !ok {
		t.Errorf("the Options' prefix %s: exists %v, %v; want it made", prefix, ok, err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The session's disconnection reaches the Logger (the backend logs
	// there), at Debug.
	for deadline := time.Now().Add(10 * time.Second); !rec.Contains("disconnected") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !rec.Contains("disconnected") {
		t.Errorf("the session's end after Close did not reach the Locker's Logger")
	}
	if got := rec.Above(slog.LevelDebug); len(got) > 0 {
		t.Errorf("a normal Close logged above Debug:\n%s", strings.Join(got, "\n"))
	}
}

// New refuses bad opts.Locker before any I/O: no connection reaches the
// server.
func TestNewRejectsBadLockerOptionsBeforeIO(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	for name, lo := range map[string]dlock.Options{
		"negative retry":  {RetryMin: -time.Millisecond},
		"TTL below floor": {TTL: time.Millisecond},
		"drift factor":    {DriftFactor: 0.7},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		l, err := zookeeper.New(ctx, []string{ln.Addr().String()}, &zookeeper.Options{Locker: &lo})
		cancel()
		if l != nil {
			_ = l.Close()
		}
		if !errors.Is(err, dlock.ErrInvalidConfig) && !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("%s: New = %v; want ErrInvalidConfig or ErrInvalidTTL", name, err)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached the server; want none (options are checked before any I/O)", n)
	}
}
