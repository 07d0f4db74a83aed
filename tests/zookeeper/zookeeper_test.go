package zookeeper_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// TestTTLAboveSessionRefusedBeforeIO: a Locker TTL above the bound of
// the session timeout asked is refused before any dial (the server's
// address refuses connections), with an error that matches
// ErrInvalidConfig and ErrInvalidTTL and names both settings. A session
// timeout below two ticks, which the servers raise, is left to the check
// once the session is granted.
func TestTTLAboveSessionRefusedBeforeIO(t *testing.T) {
	o := &zookeeper.Options{SessionTimeout: 5 * time.Second, TickTime: time.Second, Locker: &dlock.Options{TTL: 3 * time.Second}}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := zookeeper.New(ctx, []string{"127.0.0.1:1"}, o)
	if !errors.Is(err, dlock.ErrInvalidConfig) || !errors.Is(err, dlock.ErrInvalidTTL) || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("New with TTL 3s on a 5s session and a 1s tick = %v, want ErrInvalidConfig and ErrInvalidTTL before any I/O", err)
	}
	for _, name := range []string{"TTL 3s", "session timeout of 5s", "tick of 1s"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("New with TTL 3s on a 5s session and a 1s tick = %v, want it to name %q", err, name)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []zookeeper.Options{
		{Prefix: "dlock"}, {Prefix: "/dlock/"}, {Prefix: "/a//b"}, {Auth: "nopassword"}, {SessionTimeout: -time.Second},
		{SessionTimeout: time.Nanosecond}, {SessionTimeout: 10000 * time.Hour}, // not int32 milliseconds ≥ 1
		{TickTime: -time.Second}, {TickTime: time.Microsecond}, {TickTime: 10000 * time.Hour},
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
	if _, _, err := admin.Children("/authlocks/" + encodeKey(key)); !errors.Is(err, zk.ErrNoAuth) {
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

// TestTTLBoundBySession: a lease's TTL may not exceed the granted session
// timeout less a third of it less the servers' tick (Options.TickTime), so
// that its Deadline stays before the session's expiry when a follower never
// relays the request it counts from (package doc, "How long the session
// lives"). The Locker reports that bound in Limits, refuses a longer TTL
// before any I/O (Acquire and Refresh), takes it as its default TTL when
// it is below backend.DefaultTTL, and a session too short for the tick is a
// configuration error.
func TestTTLBoundBySession(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	bound := func(session, tick time.Duration) time.Duration { return session - session/3 - tick }

	// 5s on the test servers' 200ms tick: 5s - 1.67s - 0.2s.
	l := newLocker(t, srv, &zookeeper.Options{SessionTimeout: 5 * time.Second, TickTime: 200 * time.Millisecond})
	want := bound(5*time.Second, 200*time.Millisecond)
	if got := l.Limits().MaxTTL; got != want {
		t.Errorf("Limits().MaxTTL = %v on a 5s session and a 200ms tick, want %v (2/3 of the session less a tick)", got, want)
	}
	key := uniqueKey(t)
	for _, ttl := range []time.Duration{want + time.Millisecond, 5 * time.Second} {
		if _, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl}); !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("TryAcquire with TTL %v above the bound %v: %v, want ErrInvalidTTL", ttl, want, err)
		}
		if _, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl}); !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("Acquire with TTL %v above the bound %v: %v, want ErrInvalidTTL", ttl, want, err)
		}
	}
	le, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: want})
	if err != nil {
		t.Fatalf("TryAcquire with a TTL of the bound %v: %v", want, err)
	}
	if err := le.Refresh(t.Context(), want+time.Millisecond); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh with a TTL above the bound: %v, want ErrInvalidTTL", err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A Locker TTL above the bound is refused when the Locker is made.
	if _, err := openLocker(t.Context(), srv, &zookeeper.Options{SessionTimeout: 5 * time.Second, Locker: &dlock.Options{TTL: 4 * time.Second}}); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("New with Options.Locker.TTL 4s on a 5s session: %v, want ErrInvalidTTL", err)
	}

	// The defaults: a 40s session (the test servers grant it) and a 2s
	// tick give about 24.67s, the Locker's default TTL.
	def, err := zookeeper.New(t.Context(), srv, &zookeeper.Options{Locker: &dlock.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	want = bound(zookeeper.DefaultSessionTimeout, zookeeper.DefaultTickTime)
	if got := def.Limits().MaxTTL; got != want {
		t.Errorf("Limits().MaxTTL with default Options = %v, want %v", got, want)
	}
	if le, err := def.TryAcquire(t.Context(), uniqueKey(t), nil); err != nil {
		t.Error(err)
	} else {
		if le.TTL() != want {
			t.Errorf("default TTL %v, want the bound %v (below backend.DefaultTTL)", le.TTL(), want)
		}
		_ = le.Release(t.Context())
	}

	// The server raises a session timeout below its floor (2 ticks): the
	// bound follows the timeout granted.
	d, err := zookeeper.NewDriver(t.Context(), srv, &zookeeper.Options{SessionTimeout: time.Millisecond, TickTime: 200 * time.Millisecond, Locker: &dlock.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got, granted := d.Limits().MaxTTL, d.SessionTimeout(); granted <= time.Millisecond || got != bound(granted, 200*time.Millisecond) {
		t.Errorf("asked a 1ms session, granted %v: Limits().MaxTTL = %v, want %v", granted, got, bound(granted, 200*time.Millisecond))
	} else {
		t.Logf("asked a 1ms session, granted %v: MaxTTL %v", granted, got)
	}

	// A session too short for the tick leaves no TTL: New and Open fail.
	_, err = openLocker(t.Context(), srv, &zookeeper.Options{SessionTimeout: 3 * time.Second, TickTime: 2 * time.Second})
	if !errors.Is(err, dlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "too short for a tick of 2s") {
		t.Errorf("New with a 3s session and a 2s tick: %v, want ErrInvalidConfig saying the session is too short for the tick", err)
	}
	_, err = dlock.Open(t.Context(), "zk://"+srv[0]+"?session_timeout=1s&tick_time=2s")
	if !errors.Is(err, dlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "too short for a tick of 2s") {
		t.Errorf("Open with session_timeout=1s&tick_time=2s: %v, want ErrInvalidConfig saying the session is too short for the tick", err)
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
