package redis_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redis"
)

// A program opens a URL with its own client, Logger and Options through a
// mux of its own; the client is not dialled from the URL, nor closed with
// the Locker.
func TestOpenURLWithOwnClient(t *testing.T) {
	c := serverClient(t)
	rec := &conformance.LogRecorder{}
	log := slog.New(rec)
	prefix := "own-" + uniqueKey(t) + ":"
	var mux driver.URLMux
	mux.RegisterLocker("redis", &redis.URLOpener{Client: c, Options: redis.Options{
		Prefix: prefix,
		Locker: &dlock.Options{Logger: log, TTL: time.Minute},
	}})
	l, err := mux.OpenLocker(t.Context(), "redis://not-dialled?ttl=5s")
	if err != nil {
		t.Fatalf("OpenLocker: %v", err)
	}
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if le.TTL() != 5*time.Second {
		t.Errorf("TTL %v; want the URL's 5s over the Options' 1m", le.TTL())
	}
	if n, err := c.Exists(t.Context(), prefix+"{"+key+"}").Result(); err != nil || n != 1 {
		t.Errorf("the lock under the Options' prefix: exists %d, %v; want 1", n, err)
	}
	if d := driver.DriverOf(l); loggerOf(d.(*redis.Driver)) != log {
		t.Errorf("the backend does not log to the Options' Logger")
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Errorf("the program's client after Close: %v; want it open", err)
	}
	if got := rec.Above(slog.LevelDebug); len(got) > 0 {
		t.Errorf("normal use and Close logged above Debug: %q", got)
	}
}
