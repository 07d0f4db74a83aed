package etcd_test

// Holder descriptions and the change watch (issue 23): the description is
// the value of the lock key, so every write that puts the key (the join, on
// a new or a pooled lease; a move of Refresh to another TTL; the fence that
// settles a move whose answer was lost) must write it; and
// Driver.WatchChanges reports every change of a lock's queue.

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// holderIs inspects key through l and fails t unless it is held by holder
// with waiters waiters.
func holderIs(t *testing.T, l *dlock.Locker, key, holder string, waiters int, when string) {
	t.Helper()
	info, err := l.Inspect(t.Context(), key)
	if err != nil {
		t.Fatalf("%s: Inspect: %v", when, err)
	}
	if !info.Held || info.Holder != holder || info.Waiters != waiters {
		t.Errorf("%s: Inspect = %+v, want held by %q with %d waiter(s)", when, info, holder, waiters)
	}
}

// TestHolderOnEveryPath: the holder description reaches Inspect whichever
// way the key was put: a fresh lease, a pooled one (no Raft write more than
// without a description), TryAcquire, a waiter whose turn came, and it
// survives a Refresh that moves the key to a lease of another TTL.
func TestHolderOnEveryPath(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1) // Raft writes are counted: nothing else may write
	addr := c.Members[0].Addr()
	d, l := ownDriver(t, c.Endpoints())
	other := newLocker(t, c.Endpoints(), nil)
	key := uniqueKey(t)
	ttl := 20 * time.Second

	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl, Holder: "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	holderIs(t, other, key, "fresh", 0, "on a new lease")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := poolSize(d); n != 1 {
		t.Fatalf("the pool holds %d leases after a Release, want 1", n)
	}
	before := proposals(t, addr)
	le, err = l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl, Holder: "pooled ☃"})
	if err != nil {
		t.Fatal(err)
	}
	if n := proposals(t, addr) - before; n != 1 {
		t.Errorf("an Acquire with a holder on a pooled lease made %v Raft writes, want 1", n)
	}
	if n := poolSize(d); n != 0 {
		t.Fatalf("the Acquire did not take the pooled lease (the pool holds %d)", n)
	}
	holderIs(t, other, key, "pooled ☃", 0, "on a pooled lease")
	own0, _ := etcd.OwnerOf(le)
	if err := le.Refresh(t.Context(), 2*ttl); err != nil {
		t.Fatal(err)
	}
	if own1, _ := etcd.OwnerOf(le); own1.Lease == own0.Lease {
		t.Fatal("the Refresh to another TTL did not move the key to a new lease")
	}
	holderIs(t, other, key, "pooled ☃", 0, "after a Refresh to another TTL (a move)")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	le, err = l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl, Holder: "try"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl, Holder: "loser"}); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	holderIs(t, other, key, "try", 0, "held through TryAcquire, after another's failed TryAcquire")
	got := make(chan acquired, 1)
	go func() {
		wl, err := other.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl, Holder: "waiter"})
		got <- acquired{wl, err}
	}()
	for end := time.Now().Add(slack); ; time.Sleep(20 * time.Millisecond) {
		info, err := l.Inspect(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if info.Waiters == 1 {
			if info.Holder != "try" {
				t.Errorf("with a waiter queued: Inspect = %+v, want the head's holder %q", info, "try")
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no waiter queued within %v: %+v", slack, info)
		}
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	holderIs(t, l, key, "waiter", 0, "after the waiter's turn came")
	if err := a.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestHolderSurvivesSettle: the answer of a Refresh's move is lost (the
// move never commits); the fencing transaction that settles it puts the
// key again on the old lease, and must put the holder description with
// it.
func TestHolderSurvivesSettle(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 20 * time.Second, Holder: "settled"})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	holdFirstMove(d)
	if err := le.Refresh(t.Context(), 10*time.Second); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	if got, _ := etcd.OwnerOf(le); got.Lease != own.Lease {
		t.Fatalf("after settling a move that never committed, the key is on lease %x, want %x", got.Lease, own.Lease)
	}
	holderIs(t, other, key, "settled", 0, "after the fence that settled a lost move")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestWatchChangesQueue: Driver.WatchChanges reports each change of the
// queue, not only grants and releases: a waiter joining and leaving.
func TestWatchChangesQueue(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	key := uniqueKey(t)
	ttl := 20 * time.Second
	ch, stop, err := d.WatchChanges(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	drain := func() {
		select {
		case <-ch:
		default:
		}
	}
	expect := func(what string) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("the channel was closed, want a receive on %s", what)
			}
		case <-time.After(slack):
			t.Fatalf("nothing received within %v of %s", slack, what)
		}
	}
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	expect("a grant")
	drain()
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan error, 1)
	go func() {
		wl, err := other.Acquire(wctx, key, &dlock.AcquireOptions{TTL: ttl})
		if err == nil {
			_ = wl.Release(t.Context())
			err = errors.New("granted while the key was held")
		}
		got <- err
	}()
	expect("a waiter joining the queue")
	drain()
	cancel()
	if err := <-got; !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	expect("a waiter leaving the queue")
	drain()
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	expect("a release")
}

// TestWatchChangesNoLeak: stop waits for the watch's goroutine (which closes
// the channel as it ends) and leaves no goroutine behind, of ours or of the
// client's. Not parallel: the leak check counts every goroutine.
func TestWatchChangesNoLeak(t *testing.T) {
	eps := servers.Etcd(t, 1).Endpoints()
	d, l := ownDriver(t, eps)
	key := uniqueKey(t)
	// The client's connection is up before the snapshot (Inspect
	// starts no watch; the client ends its watch stream's goroutines
	// with its last watch).
	if _, err := l.Inspect(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	for range 3 {
		ch, stop, err := d.WatchChanges(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		stop()
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatal("the channel received after stop with no change")
			}
		default:
			t.Fatal("the channel is open after stop returned: its goroutine is still running")
		}
	}
	goleak.VerifyNone(t, ignore)
}

// TestWatchChangesClosedAtClose: the channel of a change watch is closed
// when the Driver is, and stop after that returns at once.
func TestWatchChangesClosedAtClose(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	d, l := ownDriver(t, eps)
	ch, stop, err := d.WatchChanges(t.Context(), uniqueKey(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			// A spurious receive is allowed; the close must follow.
			if _, ok := <-ch; ok {
				t.Fatal("the channel received twice after Close with no change")
			}
		}
	case <-time.After(slack):
		t.Fatalf("the channel was not closed within %v of the Driver's Close", slack)
	}
	stop()
}

// TestWatchChangesBadStart: a watch that cannot be started (its request
// fails) returns an error matching ErrUnavailable, and no channel.
func TestWatchChangesBadStart(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	d, _ := ownDriver(t, eps)
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	ch, stop, err := d.WatchChanges(cctx, uniqueKey(t))
	if !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, context.Canceled) || ch != nil || stop != nil {
		t.Fatalf("WatchChanges with a cancelled context = %v, %v, %v; want no channel and an error matching ErrUnavailable and context.Canceled", ch, stop != nil, err)
	}
}
