package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestOpen(t *testing.T) {
	eps := servers.Etcd(t, 1).Endpoints()
	l, err := dlock.Open(t.Context(), "etcd://"+eps[0]+"/opened?ttl=3s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if le.TTL() != 3*time.Second {
		t.Errorf("TTL() = %v, want the URL's 3s", le.TTL())
	}
	own, ok := etcd.OwnerOf(le)
	if !ok || own.Key[:len("opened/")] != "opened/" {
		t.Errorf("OwnerOf = %+v, %v; want a key under the URL's prefix", own, ok)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestPrefixKeysIndependent: lock names that are prefixes of each other, and
// names with the escape character, do not block each other.
func TestPrefixKeysIndependent(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	l := newLocker(t, eps, nil)
	base := uniqueKey(t)
	var leases []*dlock.Lease
	for _, k := range []string{base, base + "/b", base + "/b/c", base + "%2Fb", base + "%", base + "/"} {
		le, err := l.TryAcquire(t.Context(), k, nil)
		if err != nil {
			t.Fatalf("TryAcquire(%q) with the other names held: %v", k, err)
		}
		leases = append(leases, le)
	}
	for _, le := range leases {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTTLGranted: etcd raises a TTL below its floor; the lease reports what
// the server granted. Refresh to another TTL moves the key to a new lease
// and keeps the token.
func TestTTLGranted(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	l := newLocker(t, eps, nil)
	key := uniqueKey(t)
	le, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if le.TTL() < time.Second {
		t.Errorf("TTL() = %v, below the asked 1s", le.TTL())
	}
	t.Logf("asked 1s, granted %v", le.TTL())
	before, _ := etcd.OwnerOf(le)
	if err := le.Refresh(t.Context(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	after, _ := etcd.OwnerOf(le)
	if le.TTL() != 30*time.Second || after.Lease == before.Lease || after.CreateRevision != before.CreateRevision || uint64(after.CreateRevision) != uint64(le.Token()) {
		t.Errorf("after Refresh(30s): TTL %v, ownership %+v (before %+v); want 30s, a new lease, the same create revision = token", le.TTL(), after, before)
	}
	// The old lease is revoked; the key lives on the new one.
	admin := newClient(t, eps)
	ttl, err := admin.TimeToLive(t.Context(), before.Lease)
	if err != nil || ttl.TTL != -1 {
		t.Errorf("old lease TimeToLive = %v (err %v), want -1 (revoked)", ttl.TTL, err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The released lease carries no key: it waits in the pool for the
	// next grant of its TTL.
	if ttl, err := admin.TimeToLive(t.Context(), after.Lease, clientv3.WithAttachedKeys()); err != nil || len(ttl.Keys) != 0 {
		t.Errorf("lease after Release: TimeToLive = %+v (err %v), want no key on it", ttl, err)
	}
}

// TestOwnershipFencesEtcdWrites: Ownership.Cmp in a write's transaction
// lets the write through while the lock is held and stops it once lost.
func TestOwnershipFencesEtcdWrites(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	l := newLocker(t, eps, nil)
	key := uniqueKey(t)
	le, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	own, ok := etcd.OwnerOf(le)
	if !ok {
		t.Fatal("OwnerOf = false")
	}
	data := "data/" + key
	write := func(v string) bool {
		t.Helper()
		resp, err := admin.Txn(t.Context()).If(own.Cmp()).Then(clientv3.OpPut(data, v)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	if !write("by the holder") {
		t.Fatal("fenced write while holding the lock did not succeed")
	}
	if _, err := admin.Revoke(t.Context(), own.Lease); err != nil {
		t.Fatal(err)
	}
	if write("by a stale holder") {
		t.Error("fenced write after the lease was revoked succeeded")
	}
	resp, err := admin.Get(t.Context(), data)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "by the holder" {
		t.Errorf("data = %v (err %v), want the holder's write only", resp.Kvs, err)
	}
}

// TestOneLeasePerGrant: two leases on different keys in one Locker (one
// client) never share an etcd lease.
func TestOneLeasePerGrant(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	l := newLocker(t, eps, nil)
	l1, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	o1, _ := etcd.OwnerOf(l1)
	o2, _ := etcd.OwnerOf(l2)
	if o1.Lease == o2.Lease {
		t.Errorf("two grants share etcd lease %x", o1.Lease)
	}
	// Releasing one leaves the other held.
	if err := l1.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l2.Refresh(t.Context(), 0); err != nil {
		t.Errorf("the other lease after a Release: %v", err)
	}
	_ = l2.Release(context.WithoutCancel(t.Context()))
}

func TestOpenForCorrectness(t *testing.T) {
	eps := servers.Etcd(t, 1).Endpoints()
	l, err := dlock.Open(t.Context(), "etcd://"+eps[0]+"?purpose=correctness")
	if err != nil {
		t.Fatalf("Open for correctness: %v", err)
	}
	_ = l.Close()
}

// TestReleaseWithEndedContext: a Release whose context has already ended
// (`defer lease.Release(reqCtx)` after the request was cancelled, or its
// deadline passed) cannot delete the key with that context; it must still
// free the lock at once, not leave it held for the lease's whole TTL.
func TestReleaseWithEndedContext(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	for _, how := range []string{"cancelled", "deadline"} {
		t.Run(how, func(t *testing.T) {
			a, b := newLocker(t, eps, nil), newLocker(t, eps, nil)
			key := uniqueKey(t)
			const ttl = 30 * time.Second
			la, err := a.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			var ctx context.Context
			var cancel context.CancelFunc
			if how == "cancelled" {
				ctx, cancel = context.WithCancel(t.Context())
			} else {
				ctx, cancel = context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
			}
			cancel()
			rerr := la.Release(ctx)
			t.Logf("Release with a %s context: %v", how, rerr)

			// Far below the TTL: the lock must have been given up.
			const within = 5 * time.Second
			ctx, cancel = context.WithTimeout(t.Context(), within)
			defer cancel()
			start := time.Now()
			lb, err := b.Acquire(ctx, key, &dlock.AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatalf("a second Locker did not get the key within %v of a Release with a %s context (TTL %v): %v",
					within, how, ttl, err)
			}
			t.Logf("the second Locker got the key after %v", time.Since(start).Round(time.Millisecond))
			if lb.Token() <= la.Token() {
				t.Errorf("token %d not above the released %d", lb.Token(), la.Token())
			}
			if err := la.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("a second Release of the first lease = %v, want ErrNotHeld", err)
			}
			if err := lb.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReleaseAfterUnsettledMove: Refresh to another TTL moves the key onto
// a new lease. If the move committed but its answer was lost, and the read
// that should settle which lease the key is on failed too, the Lease still
// names the old etcd lease while the key sits on the new one.
//
//   - moved-by-another: the key is moved (as that lost move would leave
//     it) behind the Lease's back. Release must still delete it (it
//     compares the create revision, which identifies the grant, not the
//     lease) and report success.
//   - lost-answer: the real Refresh, with its move's answer replaced by an
//     error and the server paused so that the settling read fails. A
//     Release whose ctx has ended (its delete cannot be sent) must still
//     free the lock at once, by revoking the unsettled new lease too, not
//     leave it held for the new lease's TTL.
func TestReleaseAfterUnsettledMove(t *testing.T) {
	t.Parallel()
	t.Run("moved-by-another", func(t *testing.T) {
		t.Parallel()
		eps := servers.Etcd(t, 1).Endpoints()
		admin := newClient(t, eps)
		l := newLocker(t, eps, nil)
		le, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		own, _ := etcd.OwnerOf(le)
		g, err := admin.Grant(t.Context(), 60)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := admin.Txn(t.Context()).If(own.Cmp()).Then(clientv3.OpPut(own.Key, "", clientv3.WithLease(g.ID))).Commit()
		if err != nil || !tr.Succeeded {
			t.Fatalf("moving the key to lease %x: %v, succeeded %v", g.ID, err, tr != nil && tr.Succeeded)
		}
		if err := le.Release(t.Context()); err != nil {
			t.Errorf("Release of a lease whose key moved to another etcd lease = %v, want nil", err)
		}
		resp, err := admin.Get(t.Context(), own.Key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Errorf("after Release the key is still there on lease %x: the lock stays held for that lease's TTL", resp.Kvs[0].Lease)
		}
	})
	t.Run("lost-answer", func(t *testing.T) {
		t.Parallel()
		// A member of the test's own, to pause.
		c := ownCluster(t, 1)
		m := c.Members[0]
		admin := newClient(t, c.Endpoints())
		d, err := etcd.NewDriver(t.Context(), newClient(t, c.Endpoints()), nil)
		if err != nil {
			t.Fatal(err)
		}
		paused := false
		defer func() {
			if paused {
				_ = m.Unpause(context.WithoutCancel(t.Context()))
			}
		}()
		afterMove(d, func(err error) error {
			if err != nil || paused {
				return err
			}
			if perr := m.Pause(t.Context()); perr != nil {
				return fmt.Errorf("test: pausing the member: %w", perr)
			}
			paused = true
			return errors.New("test: the answer to the move was lost")
		})
		l := mustNew(t, d, nil)
		t.Cleanup(func() { _ = l.Close() })
		le, err := l.Acquire(t.Context(), uniqueKey(t), &dlock.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		own, _ := etcd.OwnerOf(le)
		const newTTL = 60 * time.Second
		err = le.Refresh(t.Context(), newTTL)
		t.Logf("Refresh with the move's answer lost: %v", err)
		if !paused {
			t.Fatalf("the move was not made (Refresh: %v)", err)
		}
		if err == nil || errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Refresh = %v, want an error of unknown outcome", err)
		}
		if err := m.Unpause(t.Context()); err != nil {
			t.Fatal(err)
		}
		paused = false
		resp, err := admin.Get(t.Context(), own.Key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) == own.Lease {
			t.Fatalf("the key is not on a new lease after the lost move: %v", resp.Kvs)
		}
		t.Logf("the key is on lease %x; the Lease names %x", resp.Kvs[0].Lease, own.Lease)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		t.Logf("Release with an ended ctx: %v", le.Release(ctx))
		// Far below the new lease's TTL: the lock must have been freed.
		for end := time.Now().Add(slack); ; time.Sleep(100 * time.Millisecond) {
			resp, err := admin.Get(t.Context(), own.Key)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("%v after Release the key is still there on lease %x (TTL %v): the unsettled lease was not revoked",
					slack, resp.Kvs[0].Lease, newTTL)
			}
		}
	})
}
