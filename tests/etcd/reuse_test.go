package etcd_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// The tests of the lease pool's promises: every grant gets the TTL it
// asked for, and a Deadline no later than the server's expiry; a lease
// never goes back to the pool while anything may still revoke it; no
// refresh reports a lease it does not keep alive.

// backendLease returns le's driver lease.
func backendLease(t *testing.T, le *dlock.Lease) backend.Lease {
	t.Helper()
	bl := driver.LeaseOf(le)
	if bl == nil {
		t.Fatal("no backend lease")
	}
	return bl
}

// claimWithinServer fails t unless what bl claims (it lasts TTL from
// Anchor) is within the server's expiry of the etcd lease its key is on,
// and that is the lease bl names. The server's remaining TTL counts whole
// seconds, rounded down: one is allowed.
func claimWithinServer(t *testing.T, admin *clientv3.Client, bl backend.Lease, when string) {
	t.Helper()
	var own etcd.Ownership
	if !bl.(interface{ As(any) bool }).As(&own) {
		t.Fatal("no ownership")
	}
	resp, err := admin.Get(t.Context(), own.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != own.CreateRevision {
		t.Fatalf("%s: the key is gone", when)
	}
	if on := clientv3.LeaseID(resp.Kvs[0].Lease); on != own.Lease {
		t.Fatalf("%s: the key is on lease %x, the lease names %x", when, on, own.Lease)
	}
	ttl, err := admin.TimeToLive(t.Context(), own.Lease)
	if err != nil {
		t.Fatal(err)
	}
	// The server read what is left at some time before the answer,
	// and rounds it down to whole seconds: it expires before
	// answered + TTL + 1s.
	answered := time.Now()
	claim := bl.(backend.Anchored).Anchor().Add(bl.TTL())
	if serverEnd := answered.Add(time.Duration(ttl.TTL+1) * time.Second); claim.After(serverEnd) {
		t.Errorf("%s: Anchor+TTL (TTL %v) is %v after the server's expiry (remaining TTL %ds, granted %ds)",
			when, bl.TTL(), claim.Sub(serverEnd).Round(time.Millisecond), ttl.TTL, ttl.GrantedTTL)
	}
	if bl.TTL() > time.Duration(ttl.GrantedTTL)*time.Second {
		t.Errorf("%s: TTL %v, more than the server granted (%ds)", when, bl.TTL(), ttl.GrantedTTL)
	}
}

// TestPooledGrantsKeepTheirTTL: short lock cycles on one key reuse one
// pooled lease, and every grant gets the TTL it asked for: the lease is
// renewed once less than nine tenths of its granted TTL is left. The cycles
// run for three tenths of the TTL. Before, a grant without a keepalive
// had what was left of the lease, and the next compared what it had left
// with that: the grants decayed ("cycle 65: asked 10s, granted 2.9s").
func TestPooledGrantsKeepTheirTTL(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	_, l := ownDriver(t, eps)
	key := uniqueKey(t)
	const ttl = 10 * time.Second
	ao := &dlock.AcquireOptions{TTL: ttl}
	var first clientv3.LeaseID
	reused := 0
	start := time.Now()
	for i := 0; time.Since(start) < 3*ttl/10 || i < 5; i++ {
		le, err := l.Acquire(t.Context(), key, ao)
		if err != nil {
			t.Fatal(err)
		}
		own, _ := etcd.OwnerOf(le)
		if i == 0 {
			first = own.Lease
		} else if own.Lease == first {
			reused++
		}
		if got := le.TTL(); got != ttl {
			t.Fatalf("cycle %d, %v after the first grant: asked %v, granted %v; want all of it (the server's granted TTL, counted from the lease's last renewal)",
				i, time.Since(start).Round(time.Millisecond), ttl, got)
		}
		deadlineWithinServer(t, admin, le, "a pooled grant claims more than the lease has left")
		claimWithinServer(t, admin, backendLease(t, le), "a pooled grant")
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if reused == 0 {
		t.Fatalf("the pooled lease %x was never reused", first)
	}
	t.Logf("%d grants on the pooled lease", reused)
}

// TestRevokingLeaseNotRecycled: a Release whose delete fails and whose
// revoke fails leaves the revoke to a background loop, which retries it
// for up to the TTL. A second Release then deletes the key: it must not
// put the lease back in the pool, or the next grant would get it and the
// loop would revoke it under that grant, deleting its key. The faults are
// injected (the delete once, the revokes of that lease until the next
// grant is made); then the revoke goes through, and the next grant must
// still hold its key.
func TestRevokingLeaseNotRecycled(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	ao := &dlock.AcquireOptions{TTL: 10 * time.Second}
	le, err := l.Acquire(t.Context(), uniqueKey(t), ao)
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	var failDelete, failRevoke atomic.Bool
	var refused atomic.Int32
	failDelete.Store(true)
	failRevoke.Store(true)
	injectFault(d, func(doing string, id clientv3.LeaseID) error {
		switch {
		case doing == "deleting the lock key" && failDelete.CompareAndSwap(true, false):
			return errors.New("test: the delete is not answered")
		case doing == "revoking a lease" && id == own.Lease && failRevoke.Load():
			refused.Add(1)
			return errors.New("test: the revoke is not answered")
		}
		return nil
	})
	if err := le.Release(t.Context()); err == nil || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with the delete failing = %v, want its error", err)
	}
	if refused.Load() == 0 {
		t.Fatal("Release did not try to revoke the lease")
	}
	t.Logf("Release again: %v", le.Release(t.Context()))
	next, err := l.Acquire(t.Context(), uniqueKey(t), ao)
	if err != nil {
		t.Fatal(err)
	}
	nextOwn, _ := etcd.OwnerOf(next)
	failRevoke.Store(false)
	// The background revoke goes through now.
	for end := time.Now().Add(slack); ; time.Sleep(100 * time.Millisecond) {
		ttl, err := admin.TimeToLive(t.Context(), own.Lease)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL == -1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the lease %x the failed Release began revoking is still there after %v (TTL %ds)", own.Lease, slack, ttl.TTL)
		}
	}
	resp, err := admin.Get(t.Context(), nextOwn.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || nextOwn.Lease == own.Lease {
		t.Fatalf("the next grant (on lease %x; the revoked one is %x) lost its key to the revoke a failed Release began: key %v, Err %v",
			nextOwn.Lease, own.Lease, resp.Kvs, next.Err())
	}
	if err := next.Release(t.Context()); err != nil {
		t.Fatalf("Release of the next grant: %v", err)
	}
}

// TestRefreshBatchAfterUnsettledMove: a Refresh to a shorter TTL moves the
// key onto a new lease, the move's answer is lost and the read that would
// settle it fails: the key is on the new, short lease, which nothing renews.
// RefreshBatch of the old TTL must not renew the old lease and report
// success: it must learn where the key is and keep that lease alive (or
// fail). Before, it renewed the old lease and reported the old TTL granted
// while the key ran out with the short lease.
func TestRefreshBatchAfterUnsettledMove(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	const ttl, short = 20 * time.Second, 5 * time.Second
	var loseMove, failRead atomic.Bool
	loseMove.Store(true)
	failRead.Store(true)
	afterMove(d, func(err error) error {
		if err == nil && loseMove.CompareAndSwap(true, false) {
			return errors.New("test: the answer to the move was lost")
		}
		return err
	})
	injectFault(d, func(doing string, _ clientv3.LeaseID) error {
		if doing == "settling a move of the lock key" && failRead.CompareAndSwap(true, false) {
			return errors.New("test: the read is not answered")
		}
		return nil
	})
	le, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(le)
	if err := le.Refresh(t.Context(), short); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	if failRead.Load() {
		t.Fatal("the move was not settled by a read")
	}
	resp, err := admin.Get(t.Context(), own.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) == own.Lease {
		t.Fatalf("the key is not on a new lease after the lost move: %v", resp.Kvs)
	}
	moved := clientv3.LeaseID(resp.Kvs[0].Lease)
	bl := backendLease(t, le)
	reqs := []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	r := reqs[0]
	t.Logf("RefreshBatch: granted %v, err %v", r.Granted, r.Err)
	if r.Err != nil {
		t.Fatalf("RefreshBatch of a lease whose key is still ours (on lease %x) failed: %v", moved, r.Err)
	}
	resp, err = admin.Get(t.Context(), own.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("the key is gone after RefreshBatch reported %v granted", r.Granted)
	}
	on := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttlResp, err := admin.TimeToLive(t.Context(), on)
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(ttlResp.TTL+1)*time.Second < r.Granted {
		t.Fatalf("RefreshBatch reported %v granted, but the key is on lease %x with %ds left (the old lease was %x)",
			r.Granted, on, ttlResp.TTL, own.Lease)
	}
	claimWithinServer(t, admin, bl, "after RefreshBatch")
	if err := bl.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestLeaseClaimsWithinServer: on every path that sets a lease's expiry —
// a fresh grant, a pooled grant with and without a keepalive, Refresh,
// RefreshBatch, a move, and a move settled by a read — the lease claims
// (it lasts TTL from Anchor) no more than the server grants it, and its
// Deadline is within the server's expiry. The pooled lease waits in the
// pool for less than a tenth of its TTL (so that it is handed out without
// a keepalive) but more than the server's one-second rounding: a grant
// that counted the lease's whole TTL from the acquire, rather than what
// was left of it, would claim that wait too much.
func TestLeaseClaimsWithinServer(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	const ttl = 20 * time.Second
	ao := &dlock.AcquireOptions{TTL: ttl}
	key := uniqueKey(t)
	acquire := func(when string) (*dlock.Lease, backend.Lease) {
		le, err := l.Acquire(t.Context(), key, ao)
		if err != nil {
			t.Fatal(err)
		}
		bl := backendLease(t, le)
		claimWithinServer(t, admin, bl, when)
		deadlineWithinServer(t, admin, le, when)
		return le, bl
	}
	le, _ := acquire("a fresh grant")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second / 2) // less than a tenth of the TTL
	le, _ = acquire("a pooled grant without a keepalive")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 8) // more than a tenth of the TTL in the pool
	le, bl := acquire("a pooled grant with a keepalive")
	if err := le.Refresh(t.Context(), ttl); err != nil {
		t.Fatal(err)
	}
	claimWithinServer(t, admin, bl, "Refresh")
	reqs := []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	if reqs[0].Err != nil {
		t.Fatal(reqs[0].Err)
	}
	claimWithinServer(t, admin, bl, "RefreshBatch")
	if err := le.Refresh(t.Context(), ttl/2); err != nil {
		t.Fatal(err)
	}
	claimWithinServer(t, admin, bl, "a move")
	var lost atomic.Bool
	lost.Store(true)
	afterMove(d, func(err error) error {
		if err == nil && lost.CompareAndSwap(true, false) {
			return errors.New("test: the answer to the move was lost")
		}
		return err
	})
	if err := le.Refresh(t.Context(), ttl/4); err == nil {
		t.Fatal("Refresh with the move's answer lost succeeded")
	}
	claimWithinServer(t, admin, bl, "a move settled by a read")
	if got := bl.TTL(); got != ttl/4 {
		t.Errorf("after the settled move TTL is %v, want %v", got, ttl/4)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
