package etcd_test

import (
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// A program opens a URL with its own client, Logger and Options through a
// mux of its own; the client is not dialled from the URL, nor closed with
// the Locker. The URL's path and ttl override the Options' prefix and TTL.
func TestOpenURLWithOwnClient(t *testing.T) {
	c := newClient(t, servers.Etcd(t, 1).Endpoints())
	rec := &conformance.LogRecorder{}
	log := slog.New(rec)
	path := "own-" + uniqueKey(t)
	var mux driver.URLMux
	mux.RegisterLocker("etcd", &etcd.URLOpener{Client: c, Options: etcd.Options{
		Prefix: "not-this/",
		Locker: &dlock.Options{Logger: log, TTL: time.Minute},
	}})
	l, err := mux.OpenLocker(t.Context(), "etcd://not-dialled/"+path+"?ttl=5s")
	if err != nil {
		t.Fatalf("OpenLocker: %v", err)
	}
	le, err := l.Acquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if le.TTL() != 5*time.Second {
		t.Errorf("TTL %v; want the URL's 5s over the Options' 1m", le.TTL())
	}
	if resp, err := c.Get(t.Context(), path+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 1 {
		t.Errorf("keys under the URL's prefix %s/: %v, %v; want 1", path, resp, err)
	}
	if d := driver.DriverOf(l); loggerOf(d.(*etcd.Driver)) != log {
		t.Errorf("the backend does not log to the Options' Logger")
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Get(t.Context(), path); err != nil {
		t.Errorf("the program's client after Close: %v; want it open", err)
	}
	if got := rec.Above(slog.LevelDebug); len(got) > 0 {
		t.Errorf("normal use and Close logged above Debug: %q", got)
	}
}
