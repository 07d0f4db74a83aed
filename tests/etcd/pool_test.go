package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
)

// proposals reads the member's count of committed Raft proposals.
func proposals(t *testing.T, addr string) float64 {
	t.Helper()
	n, err := metric(t.Context(), addr, "etcd_server_proposals_committed_total")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ownDriver returns a driver with a client of its own, and its Locker,
// both closed when t ends.
func ownDriver(t *testing.T, eps []string) (*etcd.Driver, *dlock.Locker) {
	t.Helper()
	d, err := etcd.NewDriver(t.Context(), newClient(t, eps), nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustNew(t, d, nil)
	t.Cleanup(func() { _ = l.Close() })
	return d, l
}

// TestCycleRaftWrites: on a member of the test's own (nothing else writes),
// Release makes exactly one Raft write (the delete; the lease goes back to
// the pool instead of being revoked), and an acquire of the same TTL after
// it makes one too (the put, on the pooled lease; no grant). Before, a
// cycle was four: grant, put, delete, revoke.
func TestCycleRaftWrites(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1)
	addr := c.Members[0].Addr()
	_, l := ownDriver(t, c.Endpoints())
	key := uniqueKey(t)
	ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
	le, err := l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatal(err)
	}
	before := proposals(t, addr)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := proposals(t, addr) - before; n != 1 {
		t.Errorf("Release made %v Raft writes, want 1", n)
	}
	before = proposals(t, addr)
	le, err = l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatal(err)
	}
	if n := proposals(t, addr) - before; n != 1 {
		t.Errorf("Acquire after a Release (same TTL) made %v Raft writes, want 1", n)
	}
	before = proposals(t, addr)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := proposals(t, addr) - before; n != 1 {
		t.Errorf("the second Release made %v Raft writes, want 1", n)
	}
}

// TestPooledLeaseRevoked: a pooled lease that the server dropped (revoked
// here; expired would be the same) is not used: the acquire that took it
// from the pool grants a new lease, and holds the lock on it.
func TestPooledLeaseRevoked(t *testing.T) {
	t.Parallel()
	eps := ownCluster(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	key := uniqueKey(t)
	ao := &dlock.AcquireOptions{TTL: 30 * time.Second}
	le, err := l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := etcd.OwnerOf(le)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := poolSize(d); n != 1 {
		t.Fatalf("%d leases in the pool after a Release, want 1", n)
	}
	if _, err := admin.Revoke(t.Context(), first.Lease); err != nil {
		t.Fatal(err)
	}
	le, err = l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatalf("Acquire with the pooled lease revoked: %v", err)
	}
	second, _ := etcd.OwnerOf(le)
	if second.Lease == first.Lease {
		t.Fatalf("the grant is on the revoked lease %x", first.Lease)
	}
	resp, err := admin.Get(t.Context(), second.Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != second.Lease || resp.Kvs[0].CreateRevision != second.CreateRevision {
		t.Fatalf("the grant's key on the server: %v, want it on lease %x", resp.Kvs, second.Lease)
	}
	select {
	case <-le.Done():
		t.Fatalf("the new grant ended: %v", le.Err())
	default:
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestPooledLeaseDeadline: a grant on a pooled lease counts its TTL from a
// keepalive sent with the put, not from the lease's past: the server keeps
// the lease at least until the grant's Deadline. The pooled lease waits 2s
// in the pool first, so that a Deadline counted from the acquire without
// that keepalive would be 2s past the server's expiry.
func TestPooledLeaseDeadline(t *testing.T) {
	t.Parallel()
	eps := ownCluster(t, 1).Endpoints()
	admin := newClient(t, eps)
	_, l := ownDriver(t, eps)
	le, first := reacquire(t, l, &dlock.AcquireOptions{TTL: 6 * time.Second}, func() {
		time.Sleep(2 * time.Second) // a third of the TTL in the pool
	})
	if own, _ := etcd.OwnerOf(le); own.Lease != first {
		t.Skipf("the pooled lease was not reused (%x, then %x)", first, own.Lease)
	}
	deadlineWithinServer(t, admin, le, "the grant's TTL was counted from before the lease's last renewal")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// reacquire acquires a new key with ao through l, releases it, calls
// between, and acquires the key again. It returns the second lease and the
// etcd lease of the first grant.
func reacquire(t *testing.T, l *dlock.Locker, ao *dlock.AcquireOptions, between func()) (*dlock.Lease, clientv3.LeaseID) {
	t.Helper()
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := etcd.OwnerOf(le)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	between()
	le, err = l.Acquire(t.Context(), key, ao)
	if err != nil {
		t.Fatal(err)
	}
	return le, first.Lease
}

// deadlineWithinServer fails t (saying why, if so) unless le's Deadline
// is within the server's expiry of its etcd lease. The server's remaining
// TTL counts whole seconds, rounded down: one is allowed.
func deadlineWithinServer(t *testing.T, admin *clientv3.Client, le *dlock.Lease, why string) {
	t.Helper()
	own, _ := etcd.OwnerOf(le)
	ttl, err := admin.TimeToLive(t.Context(), own.Lease)
	if err != nil {
		t.Fatal(err)
	}
	// The server read what is left at some time before the answer,
	// and rounds it down to whole seconds: it expires before
	// answered + TTL + 1s.
	answered := time.Now()
	if serverEnd := answered.Add(time.Duration(ttl.TTL+1) * time.Second); le.Deadline().After(serverEnd) {
		t.Errorf("Deadline is %v after the server's expiry (remaining TTL %ds): %s",
			le.Deadline().Sub(serverEnd).Round(time.Millisecond), ttl.TTL, why)
	}
}

// TestLossAcrossWatchBreak: the driver's watches break (as on a
// compaction or a member that lost its leader) and, while they are down, a
// held lease is revoked. When the watch is made again the driver reads the
// held keys, and the loss is reported; a loss after that comes through the
// new watch.
func TestLossAcrossWatchBreak(t *testing.T) {
	t.Parallel()
	eps := ownCluster(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	created := watchCreated(d)
	ao := &dlock.AcquireOptions{TTL: time.Minute}
	la, err := l.Acquire(t.Context(), uniqueKey(t), ao)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := l.Acquire(t.Context(), uniqueKey(t), ao)
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	beforeWatch(d, func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	})
	breakWatch(d)
	select {
	case <-held:
	case <-time.After(slack):
		t.Fatal("the watch was not made again after the break")
	}
	own, _ := etcd.OwnerOf(la)
	if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
		t.Fatal(err)
	}
	beforeWatch(d, nil)
	close(hold)
	select {
	case <-la.Done():
		if err := la.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", err)
		}
	case <-time.After(slack):
		t.Fatal("a lease revoked while the watch was down was not reported lost once it was back")
	}
	select {
	case <-created:
	case <-time.After(slack):
		t.Fatal("the watch was not made again")
	}
	if err := lb.Err(); err != nil {
		t.Fatalf("the other lease: %v", err)
	}
	own, _ = etcd.OwnerOf(lb)
	if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Done():
	case <-time.After(slack):
		t.Fatal("a lease revoked after the watch came back was not reported lost")
	}
}

// TestRefreshBatch: the driver renews many leases in one call. A lease of
// the same TTL is renewed by keepalive (the server's TTL is back to the
// full TTL), a revoked one fails with ErrNotHeld, and one asked for another
// TTL is moved to a lease of that TTL.
func TestRefreshBatch(t *testing.T) {
	t.Parallel()
	eps := ownCluster(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	const n = 5
	ao := &dlock.AcquireOptions{TTL: 10 * time.Second}
	reqs := make([]backend.RefreshRequest, n)
	owns := make([]etcd.Ownership, n)
	for i := range reqs {
		le, err := l.Acquire(t.Context(), uniqueKey(t), ao)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = le.Release(context.WithoutCancel(t.Context())) })
		bl := driver.LeaseOf(le)
		if bl == nil {
			t.Fatal("no backend lease")
		}
		owns[i], _ = etcd.OwnerOf(le)
		reqs[i] = backend.RefreshRequest{Lease: bl, TTL: ao.TTL}
	}
	reqs[n-1].TTL = 20 * time.Second
	if _, err := admin.Revoke(t.Context(), owns[0].Lease); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // so that a renewal shows in the server's TTL
	d.RefreshBatch(t.Context(), reqs)
	if err := reqs[0].Err; !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the revoked lease: %v, want ErrNotHeld", err)
	}
	for i := 1; i < n-1; i++ {
		if reqs[i].Err != nil || reqs[i].Granted != ao.TTL {
			t.Errorf("lease %d: granted %v, err %v; want %v", i, reqs[i].Granted, reqs[i].Err, ao.TTL)
			continue
		}
		ttl, err := admin.TimeToLive(t.Context(), owns[i].Lease)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL < 9 {
			t.Errorf("lease %d: the server's TTL is %ds after the batch, want it renewed to about 10s", i, ttl.TTL)
		}
	}
	if r := reqs[n-1]; r.Err != nil || r.Granted != 20*time.Second {
		t.Errorf("the lease asked for 20s: granted %v, err %v", r.Granted, r.Err)
	}
}

// keepalivesReceived is the number of LeaseKeepAlive messages the member at
// addr has received.
func keepalivesReceived(t *testing.T, addr string) float64 {
	t.Helper()
	n, err := metric(t.Context(), addr, `grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"}`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFreshPooledLeaseNoKeepalive: a lock taken again right after its
// release gets the pooled lease without a keepalive (the lease was renewed
// within the last tenth of its TTL), and the grant has what is left of the
// lease: a TTL a little below the asked, and a Deadline within the server's
// expiry. (Before, every grant on a pooled lease sent a keepalive: this
// test saw one.)
func TestFreshPooledLeaseNoKeepalive(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1)
	addr := c.Members[0].Addr()
	admin := newClient(t, c.Endpoints())
	_, l := ownDriver(t, c.Endpoints())
	var before float64
	le, first := reacquire(t, l, &dlock.AcquireOptions{TTL: 10 * time.Second}, func() {
		before = keepalivesReceived(t, addr)
	})
	if n := keepalivesReceived(t, addr) - before; n != 0 {
		t.Errorf("the acquire on a freshly renewed pooled lease sent %v keepalives, want 0", n)
	}
	if own, _ := etcd.OwnerOf(le); own.Lease != first {
		t.Fatalf("the pooled lease was not reused (%x, then %x)", first, own.Lease)
	}
	if ttl := le.TTL(); ttl != 10*time.Second {
		t.Errorf("TTL %v, want the 10s the server granted the lease (counted from its last renewal)", ttl)
	}
	deadlineWithinServer(t, admin, le, "the grant's TTL is more than what was left of the lease")
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
