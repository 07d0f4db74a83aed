package etcd_test

// Moves of unknown outcome (issue 20, 2c; found by a review of b1e88be):
// Refresh to another TTL moves our key onto a new lease in a transaction
// whose answer may be lost while the transaction is still in the Raft log,
// to commit later. The tests hold the real move transaction back
// (holdMove) and commit it at chosen points, and fail or answer other
// requests on purpose (injectFault).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// heldMove holds back the first move transaction of d's Refresh: the move
// fails (its answer lost, as a request timeout would report it), and
// commit sends the very transaction later.
type heldMove struct {
	mu     sync.Mutex
	to     clientv3.LeaseID
	commit func(context.Context) (bool, error)
}

func holdFirstMove(d *etcd.Driver) *heldMove {
	h := &heldMove{}
	holdMove(d, func(to clientv3.LeaseID, commit func(context.Context) (bool, error)) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.commit != nil {
			return nil // later moves go through
		}
		h.to, h.commit = to, commit
		return errors.New("test: the move's answer is lost (request timeout); the transaction is still in the Raft log")
	})
	return h
}

// lateCommit commits the held move now, and reports whether it succeeded.
func (h *heldMove) lateCommit(t *testing.T) bool {
	t.Helper()
	h.mu.Lock()
	commit := h.commit
	h.mu.Unlock()
	if commit == nil {
		t.Fatal("no move was held")
	}
	ok, err := commit(context.WithoutCancel(t.Context()))
	if err != nil {
		t.Errorf("the late move: %v", err)
	}
	return ok
}

// keyLease returns the lease own's key is on; ok is false if the key is gone
// (or not ours).
func keyLease(t *testing.T, admin *clientv3.Client, own etcd.Ownership) (clientv3.LeaseID, bool) {
	t.Helper()
	resp, err := admin.Get(t.Context(), own.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != own.CreateRevision {
		return 0, false
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), true
}

// claimWithinKeyLease checks that the lease's key is still there and that
// neither its claim (Anchor + TTL) nor its Deadline is after the server's
// expiry of the lease the key is actually on, whichever that is.
func claimWithinKeyLease(t *testing.T, admin *clientv3.Client, le *dlock.Lease, when string) {
	t.Helper()
	bl := backendLease(t, le)
	var own etcd.Ownership
	bl.(interface{ As(any) bool }).As(&own)
	on, ok := keyLease(t, admin, own)
	if !ok {
		t.Fatalf("%s: the key is gone (lease Err %v, Deadline %v ahead)", when, le.Err(), time.Until(le.Deadline()).Round(time.Millisecond))
	}
	asked := time.Now()
	ttl, err := admin.TimeToLive(t.Context(), on)
	if err != nil {
		t.Fatal(err)
	}
	serverEnd := asked.Add(time.Duration(ttl.TTL+1) * time.Second)
	if claim := bl.(backend.Anchored).Anchor().Add(bl.TTL()); claim.After(serverEnd) {
		t.Errorf("%s: Anchor+TTL (TTL %v, lease %x) is %v after the server's expiry of lease %x, which the key is on (%ds left)",
			when, bl.TTL(), own.Lease, claim.Sub(serverEnd).Round(time.Millisecond), on, ttl.TTL)
	}
	if le.Err() == nil && le.Deadline().After(serverEnd) {
		t.Errorf("%s: Deadline is %v after the server's expiry of lease %x, which the key is on (%ds left)",
			when, le.Deadline().Sub(serverEnd).Round(time.Millisecond), on, ttl.TTL)
	}
}

// leaseGone waits until the server no longer has lease id.
func leaseGone(t *testing.T, admin *clientv3.Client, id clientv3.LeaseID) bool {
	t.Helper()
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		r, err := admin.TimeToLive(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r.TTL < 0 {
			return true
		}
	}
	return false
}

// stillHeld checks that another client cannot take key.
func stillHeld(t *testing.T, other *dlock.Locker, key string, le *dlock.Lease, when string) {
	t.Helper()
	o, err := other.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: 5 * time.Second})
	if err == nil {
		defer func() { _ = o.Release(t.Context()) }()
		t.Errorf("%s: another client acquired the lock (token %d; ours %d) while our Deadline is %v ahead (lease Err %v)",
			when, o.Token(), le.Token(), time.Until(le.Deadline()).Round(time.Millisecond), le.Err())
		return
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("%s: another client's TryAcquire = %v, want the lock held", when, err)
	}
}

// TestLateMoveAfterSettle: Refresh to a 5s TTL sends the move transaction;
// its answer is lost. Refresh settles the move and revokes the new lease;
// that revoke is not answered either (it is retried in the background).
// Only then the move transaction commits. It must not: the key would sit on
// the new 5s lease, which nothing renews, while RefreshBatch renews the old
// lease and reports 20s granted, and the background revoke of the new lease
// would then delete our own key. (Before the fix, a settling read found the
// key on the old lease, and the late move committed: "RefreshBatch
// reported 20s granted (renewing lease ...), but the key is on lease ...
// with 4s left"; another client then acquired the lock 19.5s before the
// expiry RefreshBatch reported.)
func TestLateMoveAfterSettle(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	const ttl, short = 20 * time.Second, 5 * time.Second
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	h := holdFirstMove(d)
	var revokeFails atomic.Bool
	var revokesOfNew atomic.Int32
	revokeFails.Store(true)
	injectFault(d, func(doing string, id clientv3.LeaseID) error {
		if doing == "revoking a lease" && id != own.Lease {
			revokesOfNew.Add(1)
			if revokeFails.Load() {
				return errors.New("test: the revoke is not answered")
			}
		}
		return nil
	})
	bl := backendLease(t, le)
	if _, err := bl.Refresh(t.Context(), short); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	if revokesOfNew.Load() == 0 {
		t.Fatal("the Refresh did not settle the move (no revoke of the new lease was tried)")
	}
	if h.lateCommit(t) {
		t.Errorf("the move transaction committed after Refresh settled the move and began revoking its lease %x", h.to)
	}
	if on, ok := keyLease(t, admin, own); !ok || on != own.Lease {
		t.Fatalf("after the late move: the key is on lease %x (still there: %v), want %x", on, ok, own.Lease)
	}
	reqs := []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	if reqs[0].Err != nil {
		t.Fatalf("RefreshBatch: %v", reqs[0].Err)
	}
	claimWithinKeyLease(t, admin, le, "RefreshBatch after the late move")
	// The background revoke of the new lease goes through.
	revokeFails.Store(false)
	if !leaseGone(t, admin, h.to) {
		t.Fatalf("the new lease %x is still there %v after its revoke was let through", h.to, slack)
	}
	if _, ok := keyLease(t, admin, own); !ok {
		t.Fatalf("the background revoke of lease %x deleted our key; lease Err %v, Deadline %v ahead",
			h.to, le.Err(), time.Until(le.Deadline()).Round(time.Millisecond))
	}
	stillHeld(t, other, key, le, "after the background revoke")
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestLateMoveBeforeRevoke: as TestLateMoveAfterSettle, but the move
// transaction commits just before Refresh's revoke of the new lease, after
// Refresh learned the key was on the old lease. It must not commit, or the
// revoke deletes our key while the Lease's Deadline is about 20s ahead.
// (Before the fix: "the key is gone, another client holds the lock (token
// 11; ours 8) while our Deadline is 19.784s ahead".)
func TestLateMoveBeforeRevoke(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	const ttl, short = 20 * time.Second, 10 * time.Second
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	h := holdFirstMove(d)
	var once atomic.Bool
	var committed atomic.Bool
	once.Store(true)
	injectFault(d, func(doing string, id clientv3.LeaseID) error {
		if doing == "revoking a lease" && id != own.Lease && once.CompareAndSwap(true, false) {
			committed.Store(h.lateCommit(t)) // just before this revoke
		}
		return nil
	})
	rerr := le.Refresh(t.Context(), short)
	t.Logf("Refresh: %v; Deadline %v ahead", rerr, time.Until(le.Deadline()).Round(time.Millisecond))
	if rerr == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	if once.Load() {
		t.Fatal("Refresh did not revoke the new lease")
	}
	if committed.Load() {
		t.Errorf("the move transaction committed after Refresh had settled it, just before the revoke of its lease %x", h.to)
	}
	claimWithinKeyLease(t, admin, le, "after the Refresh")
	stillHeld(t, other, key, le, "after the Refresh")
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestLateMoveBeforeFence: the move transaction commits after its answer
// was lost, before Refresh settles it. Settling must find the key on the
// new lease, keep that lease (the Lease names it, TTL and Deadline within
// its expiry), and revoke the old one without deleting our key; the next
// refresh of the new TTL keeps it.
func TestLateMoveBeforeFence(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	const ttl, short = 20 * time.Second, 10 * time.Second
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	h := holdFirstMove(d)
	var once, committed atomic.Bool
	once.Store(true)
	injectFault(d, func(doing string, _ clientv3.LeaseID) error {
		if doing == "settling a move of the lock key" && once.CompareAndSwap(true, false) {
			committed.Store(h.lateCommit(t))
		}
		return nil
	})
	if err := le.Refresh(t.Context(), short); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	if !committed.Load() {
		t.Fatal("the held move did not commit before the settling")
	}
	if got, _ := etcd.OwnerOf(le); got.Lease != h.to {
		t.Errorf("after settling, the Lease names etcd lease %x, want %x (the key's)", got.Lease, h.to)
	}
	if !leaseGone(t, admin, own.Lease) {
		t.Errorf("the old lease %x was not revoked", own.Lease)
	}
	claimWithinKeyLease(t, admin, le, "after settling")
	if err := le.Refresh(t.Context(), short); err != nil {
		t.Fatalf("Refresh of the new TTL: %v", err)
	}
	claimWithinKeyLease(t, admin, le, "after the next Refresh")
	stillHeld(t, other, key, le, "after the next Refresh")
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestUnsettledMoveRevokesNothing: the move's answer is lost and the
// settling transaction fails too: the key may be on either lease, so no
// revoke of either may be sent, and a RefreshBatch of the old TTL must fail
// (ErrUnavailable, not report a grant) while it cannot settle. The move
// then commits late; the next RefreshBatch settles on the new lease, and
// moves the key to a lease of the TTL it asks for.
func TestUnsettledMoveRevokesNothing(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	other := newLocker(t, eps, nil)
	const ttl, short = 20 * time.Second, 5 * time.Second
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	h := holdFirstMove(d)
	var settleFails atomic.Bool
	var revokes atomic.Int32
	settleFails.Store(true)
	injectFault(d, func(doing string, _ clientv3.LeaseID) error {
		switch {
		case doing == "revoking a lease" && settleFails.Load():
			revokes.Add(1)
		case doing == "settling a move of the lock key" && settleFails.Load():
			return errors.New("test: the settling transaction is not answered")
		}
		return nil
	})
	bl := backendLease(t, le)
	if _, err := bl.Refresh(t.Context(), short); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	reqs := []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	if !errors.Is(reqs[0].Err, dlock.ErrUnavailable) || reqs[0].Granted != 0 {
		t.Errorf("RefreshBatch of an unsettled lease that cannot be settled: granted %v, err %v; want ErrUnavailable",
			reqs[0].Granted, reqs[0].Err)
	}
	if n := revokes.Load(); n != 0 {
		t.Errorf("%d revokes were sent while the key's lease was unsettled", n)
	}
	if !h.lateCommit(t) {
		t.Fatal("the late move did not commit (nothing settled it)")
	}
	settleFails.Store(false)
	reqs = []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	if reqs[0].Err != nil {
		t.Fatalf("RefreshBatch once the move can be settled: %v", reqs[0].Err)
	}
	if got, _ := etcd.OwnerOf(le); got.Lease == own.Lease || got.Lease == h.to {
		t.Errorf("after RefreshBatch of %v the Lease names etcd lease %x (the old %x, the moved-to %x): want a new one", ttl, got.Lease, own.Lease, h.to)
	}
	if bl.TTL() != ttl {
		t.Errorf("after RefreshBatch of %v the TTL is %v", ttl, bl.TTL())
	}
	claimWithinKeyLease(t, admin, le, "after the settling RefreshBatch")
	stillHeld(t, other, key, le, "after the settling RefreshBatch")
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}
