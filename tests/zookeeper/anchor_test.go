package zookeeper_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestDeadlineCountsFromTheRead: a lease's TTL counts from when the read
// that granted it was sent, not from when its reply came. The client sits
// behind a link with a one-way latency of 250ms (a servers.Proxy's Delay),
// so that the reply comes at least 500ms after the read was sent: the
// Deadline must be at least that much before the call's return plus the
// TTL (less the drift margin). Both grants are checked: TryAcquire of a
// free key, and Acquire of a waiter woken by the holder's release (its
// call began long before the read).
func TestDeadlineCountsFromTheRead(t *testing.T) {
	t.Parallel()
	const (
		latency = 250 * time.Millisecond // each way
		ttl     = 30 * time.Second
	)
	srv := servers.ZooKeeper(t, 1).Servers()
	p, err := servers.NewProxy(srv[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	admin := adminConn(t, srv)
	slow := newLocker(t, []string{p.Addr()}, nil)
	fast := newLocker(t, srv, nil)
	p.Delay(latency)
	margin := time.Duration(float64(ttl)*0.01) + 2*time.Millisecond // the default Options.DriftFactor
	// The read is sent at least a round trip (2 × latency) before its
	// reply reaches the client, and the call returns after that.
	check := func(what string, le *dlock.Lease, returned time.Time) {
		t.Helper()
		latest := returned.Add(-2 * latency).Add(ttl - margin)
		if d := le.Deadline(); d.After(latest) {
			t.Errorf("%s: Deadline is %v after the call returned, want at most %v (TTL %v - margin %v - a round trip of %v): "+
				"the TTL counts from later than the read was sent",
				what, d.Sub(returned).Round(time.Millisecond), latest.Sub(returned).Round(time.Millisecond), ttl, margin, 2*latency)
		}
	}

	k := uniqueKey(t)
	le, err := slow.TryAcquire(t.Context(), k, &dlock.AcquireOptions{TTL: ttl})
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	check("TryAcquire", le, returned)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A waiter: queued behind a holder on the fast link, granted by the
	// read it sends after the release's event reaches it.
	k = uniqueKey(t)
	lh, err := fast.TryAcquire(t.Context(), k, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		le  *dlock.Lease
		err error
		at  time.Time
	}
	got := make(chan grant, 1)
	go func() {
		le, err := slow.Acquire(t.Context(), k, &dlock.AcquireOptions{TTL: ttl})
		got <- grant{le, err, time.Now()}
	}()
	// Release once the waiter's node is queued (its create has crossed
	// the slow link).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if kids, _, err := admin.Children(parent(k)); err == nil && len(kids) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter's node did not appear in the queue")
		}
	}
	if err := lh.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	g := <-got
	if g.err != nil {
		t.Fatal(g.err)
	}
	check("Acquire of a waiter", g.le, g.at)
	if err := g.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
