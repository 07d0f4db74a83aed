package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestRefreshBatchOnFrozenMember: the only member freezes (its process is
// paused: its connections stay open, it answers nothing) while a Driver
// holds a few hundred leases. RefreshBatch of them all returns by its ctx's
// deadline (the watchdog's batch ctx ends at the earliest deadline in it,
// and a Release of a lease in the batch waits for the batch), with every
// lease failed with ErrUnavailable, not ErrNotHeld: the leases may live.
// Once the member is back, the next RefreshBatch renews them all (the stuck
// stream was dropped, and a new one is opened). The client is one a caller
// would pass in (no gRPC keepalive pings), so nothing else ends the stream.
func TestRefreshBatchOnFrozenMember(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 1)
	d, err := etcd.NewDriver(t.Context(), newClient(t, c.Endpoints()), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	const n = 300
	key := uniqueKey(t)
	reqs := make([]backend.RefreshRequest, n)
	var (
		wg       sync.WaitGroup
		sem      = make(chan struct{}, 32)
		mu       sync.Mutex
		firstErr error
	)
	for i := range reqs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			bl, err := d.TryAcquire(t.Context(), backend.Request{Key: fmt.Sprintf("%s.%d", key, i), TTL: time.Minute})
			if err != nil {
				mu.Lock()
				firstErr = cmpOr(firstErr, err)
				mu.Unlock()
				return
			}
			reqs[i] = backend.RefreshRequest{Lease: bl, TTL: time.Minute}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	m := c.Members[0]
	if err := m.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if unpaused {
			return
		}
		unpaused = true
		if err := m.Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("unpausing the member: %v", err)
		}
	}
	defer unpause()
	const patience = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		d.RefreshBatch(ctx, reqs)
	}()
	select {
	case <-done:
		t.Logf("RefreshBatch returned %v after it was called (ctx deadline %v)", time.Since(start).Round(time.Millisecond), patience)
	case <-time.After(patience + slack):
		unpause()
		<-done
		t.Fatalf("RefreshBatch of %d leases on a frozen member was still running %v past its ctx's deadline (%v); it returned only once the member was unpaused",
			n, slack, patience)
	}
	for i, r := range reqs {
		if !errors.Is(r.Err, dlock.ErrUnavailable) || errors.Is(r.Err, dlock.ErrNotHeld) {
			t.Fatalf("lease %d on a frozen member: granted %v, err %v; want ErrUnavailable", i, r.Granted, r.Err)
		}
	}
	unpause()
	for end := time.Now().Add(slack); ; time.Sleep(100 * time.Millisecond) {
		for i := range reqs {
			reqs[i].Granted, reqs[i].Err = 0, nil
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		d.RefreshBatch(ctx, reqs)
		cancel()
		var failed error
		for i, r := range reqs {
			if r.Err != nil || r.Granted != time.Minute {
				failed = fmt.Errorf("lease %d: granted %v, err %w", i, r.Granted, r.Err)
				break
			}
		}
		if failed == nil {
			return
		}
		if errors.Is(failed, dlock.ErrNotHeld) || time.Now().After(end) {
			t.Fatalf("RefreshBatch after the member is back: %v", failed)
		}
	}
}

// cmpOr returns a if it is not nil, else b.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// TestPooledLeaseSameKeyBehindWaiter: a holder releases and at once asks
// for the same lock again. Its lease comes back from the pool, so its new
// key has the very name of the key it just deleted (the lock's directory
// plus the lease ID). The waiter of another Locker that was queued behind
// the old key goes first; the holder's new grant comes after it, with a
// larger token, and the delete of the old key (a lower revision, seen by
// the same directory watch) is not taken for the loss of the new one.
func TestPooledLeaseSameKeyBehindWaiter(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, la := ownDriver(t, eps)
	lb := newLocker(t, eps, nil)
	key := uniqueKey(t)
	const ttl = 30 * time.Second
	for round := range 3 {
		first, err := la.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		own1, _ := etcd.OwnerOf(first)
		resB := acquireAsync(t.Context(), lb, key, ttl)
		queueLen(t, admin, key, 2)
		if err := first.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := poolSize(d); n != 1 {
			t.Fatalf("round %d: %d leases in the pool after the Release, want 1", round, n)
		}
		resA := acquireAsync(t.Context(), la, key, ttl)
		var b acquired
		select {
		case b = <-resB:
		case <-time.After(slack):
			t.Fatalf("round %d: the waiter was not granted after the holder's Release", round)
		}
		if b.err != nil {
			t.Fatalf("round %d: waiter: %v", round, b.err)
		}
		queueLen(t, admin, key, 2) // the holder's new key, behind the waiter
		select {
		case a := <-resA:
			t.Fatalf("round %d: the old holder was granted (%v) while the waiter holds the lock", round, a.err)
		default:
		}
		if b.le.Token() <= first.Token() {
			t.Fatalf("round %d: waiter token %d not above the old holder's %d", round, b.le.Token(), first.Token())
		}
		if err := b.le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		var a acquired
		select {
		case a = <-resA:
		case <-time.After(slack):
			t.Fatalf("round %d: the old holder was not granted after the waiter's Release", round)
		}
		if a.err != nil {
			t.Fatalf("round %d: holder again: %v", round, a.err)
		}
		own2, _ := etcd.OwnerOf(a.le)
		if own2.Key != own1.Key {
			t.Logf("round %d: the pooled lease was not reused (key %s, then %s)", round, own1.Key, own2.Key)
		}
		if a.le.Token() <= b.le.Token() {
			t.Fatalf("round %d: token %d not above the waiter's %d", round, a.le.Token(), b.le.Token())
		}
		// It was woken by the waiter's delete, which the directory's watch saw
		// after the old key's delete: a loss taken from that delete
		// would have been reported by now.
		if err := a.le.Err(); err != nil {
			t.Fatalf("round %d: the new grant on the reused key name ended: %v", round, err)
		}
		if err := a.le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// queueLen waits until key's queue holds n keys.
func queueLen(t *testing.T, admin *clientv3.Client, key string, n int) {
	t.Helper()
	var got int64
	for end := time.Now().Add(slack); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		resp, err := admin.Get(t.Context(), dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if got = resp.Count; got == int64(n) {
			return
		}
	}
	t.Fatalf("key %q: %d keys queued, want %d", key, got, n)
}

// TestMoveThenPooled: a lease whose key was moved to a lease of another
// TTL (Refresh with another TTL) goes back to the pool under its new TTL
// when released; the next grant of that TTL takes it, on a key of its own
// name, and its Deadline is not past the server's expiry. The lease the key
// was moved from is revoked.
func TestMoveThenPooled(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := etcd.OwnerOf(le)
	if err := le.Refresh(t.Context(), 12*time.Second); err != nil {
		t.Fatal(err)
	}
	moved, _ := etcd.OwnerOf(le)
	if moved.Lease == before.Lease || moved.Key != before.Key || moved.CreateRevision != before.CreateRevision {
		t.Fatalf("after the move: %+v, before %+v", moved, before)
	}
	if ttl, err := admin.TimeToLive(t.Context(), before.Lease); err != nil || ttl.TTL != -1 {
		t.Fatalf("the lease the key moved from: TTL %v, %v; want revoked", ttl, err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := poolSize(d); n != 1 {
		t.Fatalf("%d leases in the pool, want 1", n)
	}
	again, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 12 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	own, _ := etcd.OwnerOf(again)
	if own.Lease != moved.Lease {
		t.Fatalf("the grant of the moved-to TTL is on lease %x, want the pooled %x", own.Lease, moved.Lease)
	}
	if own.Key == before.Key || own.CreateRevision <= moved.CreateRevision {
		t.Fatalf("the new grant %+v reuses the old key %+v", own, moved)
	}
	ttl, err := admin.TimeToLive(t.Context(), own.Lease, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	// The server read what is left at some time before the answer,
	// and rounds it down to whole seconds: it expires before
	// answered + TTL + 1s.
	answered := time.Now()
	if len(ttl.Keys) != 1 || string(ttl.Keys[0]) != own.Key {
		t.Fatalf("keys on the pooled lease: %q, want just %q", ttl.Keys, own.Key)
	}
	if dl, end := again.Deadline(), answered.Add(time.Duration(ttl.TTL+1)*time.Second); dl.After(end) {
		t.Fatalf("Deadline %v past the server's expiry (TTL %ds)", dl.Sub(end), ttl.TTL)
	}
	if err := again.Refresh(t.Context(), 12*time.Second); err != nil {
		t.Fatal(err)
	}
	if own2, _ := etcd.OwnerOf(again); own2 != own {
		t.Fatalf("a Refresh of the same TTL moved the key: %+v, was %+v", own2, own)
	}
	if err := again.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestRefreshBatchAvoidsFrozenMember: a Driver whose client has two
// members, one of them a frozen follower (its process paused: connections
// open, nothing answered), refreshes a batch of leases again and again.
// The client sends each request, and opens each keepalive stream, to the
// next member in turn, so a batch's read of its keys and its keepalives
// often go to the frozen one: they must be sent again, to the other
// member, within the batch's time, not left to fail every lease of the
// batch. Every batch must renew every lease (250: the keys are read in 3
// transactions).
func TestRefreshBatchAvoidsFrozenMember(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 3)
	admin := newClient(t, c.Endpoints())
	lead := leader(t, c, admin)
	frozen, live := c.Members[(lead+1)%3], c.Members[(lead+2)%3]
	d, l := ownDriver(t, []string{frozen.Addr(), live.Addr()})
	const n, ttl = 250, 30 * time.Second // 3 reads of up to 100 keys
	reqs := make([]backend.RefreshRequest, n)
	for i := range reqs {
		le, err := l.TryAcquire(t.Context(), fmt.Sprintf("%s.%d", uniqueKey(t), i), &dlock.AcquireOptions{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		reqs[i] = backend.RefreshRequest{Lease: driver.LeaseOf(le), TTL: ttl}
	}
	if err := frozen.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := frozen.Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("unpausing the member: %v", err)
		}
	}()
	const batches = 8
	readFailed, kaFailed := 0, 0
	for b := range batches {
		for i := range reqs {
			reqs[i].Granted, reqs[i].Err = 0, nil
		}
		ctx, cancel := context.WithTimeout(t.Context(), 6*time.Second)
		start := time.Now()
		d.RefreshBatch(ctx, reqs)
		cancel()
		var errs []error
		for _, r := range reqs {
			if r.Err != nil {
				errs = append(errs, r.Err)
			}
		}
		switch {
		case len(errs) == 0:
		case strings.Contains(errs[0].Error(), "checking the lock keys"):
			readFailed++
		default:
			kaFailed++
		}
		first := error(nil)
		if len(errs) > 0 {
			first = errs[0]
		}
		t.Logf("batch %d: %d of %d leases failed, in %v (first error: %v)", b, len(errs), n, time.Since(start).Round(time.Millisecond), first)
	}
	if readFailed+kaFailed > 0 {
		t.Errorf("of %d batches, %d failed on the read of their keys and %d on their keepalives", batches, readFailed, kaFailed)
	}
}

// TestRefreshKeyTakenOffLease: someone else puts the lock key again
// without a lease (its create revision, the token, stays): it no longer
// goes with the holder's lease, so neither refresh may report the lock
// held, the backend's Refresh nor RefreshBatch.
func TestRefreshKeyTakenOffLease(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	const ttl = 30 * time.Second
	for _, batch := range []bool{false, true} {
		le, err := l.TryAcquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		own, _ := etcd.OwnerOf(le)
		if _, err := admin.Put(t.Context(), own.Key, "taken"); err != nil {
			t.Fatal(err)
		}
		if err := refreshBackend(t, d, le, ttl, batch); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("refresh (batch: %v) of a key put again off its lease: %v; want ErrNotHeld", batch, err)
		}
		_ = le.Release(t.Context())
		_, _ = admin.Delete(t.Context(), own.Key)
	}
}

// TestRefreshReadsPastFollower: on a 3-member cluster, a Locker whose
// client talks to a follower holds a lock; someone deletes the lock key
// through the leader, and that delete has been answered. A refresh to the
// same TTL (a keepalive, which the leader answers, and a check of the key)
// must then find the key gone: ErrNotHeld, every time, whether it is the
// backend's Refresh or the RefreshBatch the watchdog calls. A check the
// follower answers from its own state, which may not yet hold the delete,
// would report the lock held, and so would trusting the directory's watch
// (its events come from the follower, and from a frozen member never). Run
// many times, as the follower usually catches up within a millisecond.
func TestRefreshReadsPastFollower(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, 3)
	admin := newClient(t, c.Endpoints())
	lead := leader(t, c, admin)
	follower := (lead + 1) % len(c.Members)
	d, l := ownDriver(t, []string{c.Members[follower].Addr()})
	deleter := newClient(t, []string{c.Members[lead].Addr()})
	const rounds, ttl = 200, 5 * time.Second
	for _, batch := range []bool{false, true} {
		stale := 0
		for i := range rounds {
			k := fmt.Sprintf("%s.%v.%d", uniqueKey(t), batch, i)
			le, err := l.TryAcquire(t.Context(), k, &dlock.AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatalf("batch %v, round %d: TryAcquire: %v", batch, i, err)
			}
			own, ok := etcd.OwnerOf(le)
			if !ok {
				t.Fatal("OwnerOf: not an etcd lease")
			}
			resp, err := deleter.Txn(t.Context()).
				If(clientv3.Compare(clientv3.CreateRevision(own.Key), "=", own.CreateRevision)).
				Then(clientv3.OpDelete(own.Key)).Commit()
			if err != nil || !resp.Succeeded {
				t.Fatalf("batch %v, round %d: deleting the key through the leader: %v (succeeded: %v)", batch, i, err, resp != nil && resp.Succeeded)
			}
			switch err := refreshBackend(t, d, le, ttl, batch); {
			case err == nil:
				stale++
			case !errors.Is(err, backend.ErrNotHeld):
				t.Fatalf("batch %v, round %d: after the delete: %v; want ErrNotHeld", batch, i, err)
			}
			_ = le.Release(t.Context())
		}
		if stale > 0 {
			t.Errorf("batch %v: in %d of %d rounds, after a delete answered by the leader, the key was reported still held", batch, stale, rounds)
		}
	}
}

// refreshBackend refreshes le to ttl in the backend itself (the Locker may
// know of a loss already and not ask): through its lease's Refresh, or
// through d's RefreshBatch (what AutoRefresh calls) if batch.
func refreshBackend(t *testing.T, d *etcd.Driver, le *dlock.Lease, ttl time.Duration, batch bool) error {
	t.Helper()
	bl := driver.LeaseOf(le)
	if !batch {
		_, err := bl.Refresh(t.Context(), ttl)
		return err
	}
	reqs := []backend.RefreshRequest{{Lease: bl, TTL: ttl}}
	d.RefreshBatch(t.Context(), reqs)
	return reqs[0].Err
}
