package zookeeper_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("zk://u:p@h2,h1:2181/locks/?session_timeout=5s")
	srv, o, err := zookeeper.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if len(srv) != 2 || srv[0] != "h2:2181" || srv[1] != "h1:2181" || o.Prefix != "/locks" || o.Auth != "u:p" || o.SessionTimeout != 5*time.Second {
		t.Errorf("parsed %v %+v", srv, o)
	}
	for _, bad := range []string{
		"zk:///locks", "zk://h1,,h2", "zk://h1?foo=1", "zk://h1?session_timeout=-1s",
		"zk://h1?session_timeout=x", "zk://user@h1",
	} {
		u, err := url.Parse(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := zookeeper.ParseURL(u); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []zookeeper.Options{
		{Prefix: "dlock"}, {Prefix: "/dlock/"}, {Prefix: "/a//b"}, {Auth: "nopassword"}, {SessionTimeout: -time.Second},
		{SessionTimeout: time.Nanosecond}, {SessionTimeout: 10000 * time.Hour}, // not int32 milliseconds ≥ 1
	} {
		// A bad option is refused at once; the deadline only keeps an
		// accepted one from waiting forever on the closed port.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if _, err := zookeeper.NewDriver(ctx, []string{"127.0.0.1:1"}, &o); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", o, err)
		}
		cancel()
	}
	if _, err := zookeeper.NewDriver(t.Context(), nil, nil); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("no servers: %v, want ErrInvalidConfig", err)
	}
}

// TestOpenWithDigestAuth opens a Locker from a URL with digest credentials
// and a prefix; its nodes are readable by that identity only.
func TestOpenWithDigestAuth(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	l, err := dlock.Open(t.Context(), "zk://alice:secret@"+srv[0]+"/authlocks?session_timeout=20s&ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if le.TTL() != 5*time.Second {
		t.Errorf("TTL() = %v, want the URL's 5s", le.TTL())
	}
	// Without the credentials the queue cannot even be listed.
	admin := adminConn(t, srv)
	if _, _, err := admin.Children("/authlocks/" + zookeeper.EncodeKey(key)); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("listing the queue without credentials = %v, want ErrNoAuth", err)
	}
	// With them, another Locker sees the lock held.
	l2, err := dlock.Open(t.Context(), "zk://alice:secret@"+srv[0]+"/authlocks")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if _, err := l2.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("TryAcquire with the same credentials while held = %v, want ErrNotAcquired", err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestTTLBoundBySession: a lease may not outlast the session timeout the
// server granted, which the Locker reports in Limits.
func TestTTLBoundBySession(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	l := newLocker(t, srv, &zookeeper.Options{SessionTimeout: 5 * time.Second})
	if got := l.Limits().MaxTTL; got != 5*time.Second {
		t.Errorf("Limits().MaxTTL = %v, want the granted session timeout 5s", got)
	}
	_, err := l.TryAcquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: 6 * time.Second})
	if !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("TTL above the session timeout: %v, want ErrInvalidTTL", err)
	}
	// The server raises a session timeout below its floor (2 ticks).
	low := newLocker(t, srv, &zookeeper.Options{SessionTimeout: time.Millisecond})
	if got := low.Limits().MaxTTL; got <= time.Millisecond {
		t.Errorf("Limits().MaxTTL = %v after asking 1ms, want the server's floor", got)
	} else {
		t.Logf("asked a 1ms session, granted %v", got)
	}
}

func TestOpenForCorrectness(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	l, err := dlock.Open(t.Context(), "zk://"+srv[0]+"?purpose=correctness")
	if err != nil {
		t.Fatalf("Open for correctness: %v", err)
	}
	_ = l.Close()
}
