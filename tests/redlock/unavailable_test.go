package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestUnavailableIsNotCallersDeadline: with 3 of 5 nodes cut off (their
// links blackholed), an attempt, an Inspect, a refresh and a release fail with
// ErrUnavailable. The nodes' round trips were cut at the per-node timeout,
// the Driver's own deadline: the errors must not match
// context.DeadlineExceeded (nor ErrNotAcquired), which would tell the
// caller that their own context had ended. When the caller's context does
// end during the attempt, the error matches ErrNotAcquired and
// context.DeadlineExceeded.
func TestUnavailableIsNotCallersDeadline(t *testing.T) {
	t.Parallel()
	nodes := addrs(servers.Redis(t, 5))
	var links []*servers.Proxy
	for i := 2; i < 5; i++ {
		p, err := servers.NewProxy(nodes[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		links = append(links, p)
		nodes[i] = p.Addr()
	}
	const ttl = 10 * time.Second // the per-node timeout: min(NodeTimeout, ttl/10) = 300ms
	cs := clients(t, nodes)
	opts := &redlock.Options{NodeTimeout: 300 * time.Millisecond}
	d, err := redlock.NewDriver(t.Context(), cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := redlock.New(t.Context(), cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// A lease taken while every link is up, to refresh and release once
	// they are cut (on a loaded machine a round can fail: try again).
	held := uniqueKey(t) + ".held"
	var le backend.Lease
	for i := 0; i < 20; i++ {
		if le, err = d.TryAcquire(t.Context(), backend.Request{Key: held, TTL: ttl}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("TryAcquire with every node up, 20 attempts: %v", err)
	}

	for _, p := range links {
		p.Blackhole()
	}
	defer func() {
		for _, p := range links {
			p.Heal()
		}
	}()
	check := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s with 3 of 5 nodes cut off succeeded", what)
		case !errors.Is(err, backend.ErrUnavailable):
			t.Errorf("%s with 3 of 5 nodes cut off = %v; want ErrUnavailable", what, err)
		case errors.Is(err, context.DeadlineExceeded):
			t.Errorf("%s with 3 of 5 nodes cut off = %v; it matches context.DeadlineExceeded, but the caller's context has not ended", what, err)
		case errors.Is(err, backend.ErrNotAcquired):
			t.Errorf("%s with 3 of 5 nodes cut off = %v; want it not to match ErrNotAcquired (the caller's context has not ended)", what, err)
		default:
			t.Logf("%s: %v", what, err)
		}
	}
	key := uniqueKey(t)
	_, err = d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: ttl})
	check("Driver.TryAcquire", err)
	_, err = l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	check("Locker.TryAcquire", err)
	_, err = d.Inspect(t.Context(), key)
	check("Inspect", err)
	_, err = le.Refresh(t.Context(), ttl)
	check("Refresh", err)
	err = le.Release(t.Context())
	check("Release", err)

	// The caller's deadline, shorter than the per-node timeout, ends the
	// attempt: that is the caller's doing.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = d.TryAcquire(ctx, backend.Request{Key: key, TTL: ttl})
	if !errors.Is(err, backend.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryAcquire whose context ended = %v; want ErrNotAcquired and context.DeadlineExceeded", err)
	}
}
