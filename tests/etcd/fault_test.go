package etcd_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// slack bounds how late a signal may come: generous, as test machines are
// noisy. The tests check that things happen, not how fast.
const slack = 10 * time.Second

// faultCluster starts a 3-member cluster of the test's own, to kill members
// of.
func faultCluster(t *testing.T) *servers.EtcdCluster {
	t.Helper()
	return ownCluster(t, 3)
}

// ownCluster starts an n-member cluster of the test's own (to pause, kill,
// or read server-wide metrics of), terminated when the test ends.
func ownCluster(t *testing.T, n int) *servers.EtcdCluster {
	t.Helper()
	c, err := servers.StartEtcd(t.Context(), n)
	if err != nil {
		t.Fatalf("starting a %d-member etcd cluster: %v", n, err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
	return c
}

// leader returns the index in c.Members of the current leader.
func leader(t *testing.T, c *servers.EtcdCluster, cli *clientv3.Client) int {
	t.Helper()
	for deadline := time.Now().Add(slack); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for i, m := range c.Members {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second) // a killed member never answers
			st, err := cli.Status(ctx, m.Addr())
			cancel()
			if err == nil && st.Header.MemberId == st.Leader {
				return i
			}
		}
	}
	t.Fatal("no leader found")
	return -1
}

// tryUntilAnswered calls TryAcquire until the cluster answers (during an
// election it may fail with ErrUnavailable) and returns the outcome.
func tryUntilAnswered(t *testing.T, l *dlock.Locker, key string) (*dlock.Lease, error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(slack); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		var le *dlock.Lease
		le, err = l.TryAcquire(ctx, key, &dlock.AcquireOptions{TTL: 5 * time.Second})
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) {
			return le, err
		}
	}
	t.Fatalf("the cluster did not answer within %v: %v", slack, err)
	return nil, nil
}

// TestWatchdogAcrossLeaderKill: the leader (found by asking each member,
// not assumed to be Members[0]) is killed while an auto-refreshed lease is
// held, and stays down. The watchdog keeps the lease alive through the new
// leader past its TTL, and the lock is still held on the servers. (Mutual
// exclusion, token order and progress across a leader kill and restart are
// the fault matrix's KillRestart cell, tests/matrix.)
func TestWatchdogAcrossLeaderKill(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	eps := c.Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	key := uniqueKey(t)

	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 5 * time.Second, AutoRefresh: true, MaxHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	old := leader(t, c, admin)
	if err := c.Members[old].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if i := leader(t, c, admin); i == old {
		t.Fatalf("member %d still reported as leader after its kill", i)
	}
	// Past the lease's TTL: the watchdog kept it alive through the new
	// leader.
	time.Sleep(6 * time.Second)
	if err := la.Err(); err != nil {
		t.Fatalf("the holder's lease ended across the leader change: %v", err)
	}
	if _, err := tryUntilAnswered(t, b, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while held, a TTL after the leader change = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Members[old].Start(t.Context()); err != nil {
		t.Fatalf("restarting the old leader: %v", err)
	}
}

// TestMajorityDown: with two of three members down (the leader among them),
// Acquire fails within the caller's deadline, reports the backend
// unavailable, and grants nothing. Without a deadline, Acquire, TryAcquire
// and Release fail within the request timeout (the etcd client alone would
// retry until a member answers); so they do with every member down, when
// the client cannot connect at all.
func TestMajorityDown(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	eps := c.Endpoints()
	admin := newClient(t, eps)
	l := newLocker(t, eps, nil)
	key := uniqueKey(t)
	held, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	lead := leader(t, c, admin)
	down := []int{lead, (lead + 1) % len(c.Members)}
	for _, i := range down {
		if err := c.Members[i].Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	const deadline = 3 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	start := time.Now()
	le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: 5 * time.Second})
	took := time.Since(start)
	cancel()
	if err == nil {
		t.Fatalf("Acquire with a majority down returned a lease (token %d)", le.Token())
	}
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire with a majority down = %v; want ErrUnavailable, ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > deadline+2*time.Second {
		t.Errorf("Acquire took %v past a %v deadline", took, deadline)
	}
	t.Logf("Acquire with 2 of 3 members down: %v after %v", err, took.Round(time.Millisecond))

	// No deadline: each call must still end, within the request timeout.
	noDeadline(t, "with a majority down", l, key, held)

	// Every member down: the client cannot connect.
	if err := c.Members[(lead+2)%len(c.Members)].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	noDeadline(t, "with every member down", l, key, held)

	// Bring the members back (together: each needs a quorum to serve)
	// and check that nothing was granted: no key in the lock's queue.
	var wg sync.WaitGroup
	for i := range c.Members {
		wg.Go(func() {
			if err := c.Members[i].Start(t.Context()); err != nil {
				t.Errorf("restarting member %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	var resp *clientv3.GetResponse
	for end := time.Now().Add(slack); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		resp, err = admin.Get(ctx, dir(key), clientv3.WithPrefix())
		cancel()
		if err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		t.Fatalf("reading the queue after recovery: %v", err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("%d key(s) left in the queue after the failed Acquire", len(resp.Kvs))
	}
}

// noDeadline checks that Acquire, TryAcquire and a Release of held, called
// without a deadline while the cluster cannot serve, fail with
// ErrUnavailable within etcd.DefaultRequestTimeout (plus slack), granting
// nothing.
func noDeadline(t *testing.T, when string, l *dlock.Locker, key string, held *dlock.Lease) {
	t.Helper()
	bound := etcd.DefaultRequestTimeout + slack
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error {
			le, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: 5 * time.Second})
			if err == nil {
				t.Errorf("Acquire %s returned a lease (token %d)", when, le.Token())
			}
			return err
		}},
		{"TryAcquire", func(ctx context.Context) error {
			le, err := l.TryAcquire(ctx, key, &dlock.AcquireOptions{TTL: 5 * time.Second})
			if err == nil {
				t.Errorf("TryAcquire %s returned a lease (token %d)", when, le.Token())
			}
			return err
		}},
		{"Release", func(ctx context.Context) error {
			if held.Err() != nil {
				return dlock.ErrUnavailable // released by an earlier round
			}
			return held.Release(ctx)
		}},
	}
	for _, c := range calls {
		// ctx has no deadline; it is cancelled only to end a call that
		// overran, so that the test does not hang.
		ctx, cancel := context.WithCancel(t.Context())
		res := make(chan error, 1)
		start := time.Now()
		go func() { res <- c.call(ctx) }()
		select {
		case err := <-res:
			t.Logf("%s %s, no deadline: %v after %v", c.name, when, err, time.Since(start).Round(time.Millisecond))
			if !errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("%s %s = %v, want ErrUnavailable", c.name, when, err)
			}
		case <-time.After(bound):
			cancel()
			t.Errorf("%s %s, without a deadline, still running after %v", c.name, when, bound)
			<-res
		}
		cancel()
	}
}

// TestHolderLeaseRevoked: the holder's lease is revoked on the servers (as
// an operator, or a lease expired in the servers' eyes, would end it) while
// another client waits; the waiter is granted the lock, and the old
// holder's Release returns ErrNotHeld (the matrix accepts ErrLeaseLost
// too, and its ManyClientsExpire cell a nil error) and leaves the new
// holder's key (looked at on the servers) and lease alone. (The fault
// matrix checks the rest: its ClientPause cell a holder that stops
// refreshing, with its Done, late write and stale release; its
// ManyClientsExpire cell exclusion, token order and progress under
// revokes; the conformance suite the Done and Err of a revoked lease.)
func TestHolderLeaseRevoked(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 3).Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	key := uniqueKey(t)
	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		lb, err := b.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- lb
	}()
	own, ok := etcd.OwnerOf(la)
	if !ok {
		t.Fatal("OwnerOf(etcd lease) = false")
	}
	if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
		t.Fatal(err)
	}
	var lb *dlock.Lease
	select {
	case lb = <-got:
	case <-time.After(slack):
		t.Fatal("the waiter did not get the lock after the holder's lease was revoked")
	}
	if lb == nil {
		t.FailNow()
	}
	if err := la.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("old holder's Release = %v, want ErrNotHeld", err)
	}
	resp, err := admin.Get(t.Context(), dir(key), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(lb.Token()) {
		t.Errorf("the key's queue after the stale release: %d keys, want the new holder's (create revision %d)", len(resp.Kvs), lb.Token())
	}
	if err := lb.Err(); err != nil {
		t.Errorf("the new holder was disturbed: %v", err)
	}
	if err := lb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestWaiterLeaseLostWhileQueued: a waiter whose own lease is revoked while
// it is queued fails; it is never granted the lock.
func TestWaiterLeaseLostWhileQueued(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
	key := uniqueKey(t)
	la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 10 * time.Second})
		if err == nil {
			_ = lb.Release(context.WithoutCancel(t.Context()))
		}
		res <- err
	}()
	// Find the waiter's key (the second in the queue) and revoke its lease.
	var waiterLease clientv3.LeaseID
	for end := time.Now().Add(slack); waiterLease == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the waiter never queued")
		}
		resp, err := admin.Get(t.Context(), dir(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 2 {
			waiterLease = clientv3.LeaseID(resp.Kvs[1].Lease)
		}
	}
	if _, err := admin.Revoke(t.Context(), waiterLease); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("Acquire of a waiter whose lease was revoked = %v, want ErrUnavailable", err)
		}
	case <-time.After(slack):
		t.Fatal("the waiter whose lease was revoked did not return")
	}
}

// TestNewWithFrozenMember: with one member of three frozen (its process
// paused: connections stay open, nothing is answered), NewDriver on a
// client that is already connected to all three succeeds or fails within
// its request timeout for each request — the member list, the probe
// lease's grant and its revoke — never waiting for ctx's deadline. A
// probe lease that could not be revoked does not fail it.
func TestNewWithFrozenMember(t *testing.T) {
	t.Parallel()
	c := faultCluster(t)
	cli := newClient(t, c.Endpoints())
	for range 9 { // connections to every member
		if _, err := cli.Get(t.Context(), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Members[1].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Members[1].Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("unpausing member 1: %v", err)
		}
	}()
	const timeout = 2 * time.Second
	// Three requests, each within the timeout; ctx's deadline is far.
	bound := 3*timeout + slack
	var ok int
	for i := range 6 {
		ctx, cancel := context.WithTimeout(t.Context(), bound+20*time.Second)
		start := time.Now()
		d, err := etcd.NewDriver(ctx, cli, &etcd.Options{RequestTimeout: timeout})
		took := time.Since(start)
		cancel()
		t.Logf("NewDriver #%d: %v after %v", i, err, took.Round(time.Millisecond))
		if took > bound {
			t.Fatalf("NewDriver #%d took %v with one member frozen (RequestTimeout %v): want at most %v", i, took, timeout, bound)
		}
		if err != nil {
			if !errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("NewDriver #%d = %v, want success or ErrUnavailable", i, err)
			}
			continue
		}
		ok++
		_ = d.Close()
	}
	t.Logf("%d of 6 succeeded", ok)
}
