package etcd_test

// A seeded mix of lease operations with faults injected by count (issue
// 20; first written by a review of b1e88be). REVIEW_SEED=N replays a seed.

import (
	"context"
	"errors"
	"math/rand"
	"os"
	"strconv"
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

// TestRandomLeaseOps: a seeded mix of Acquire, TryAcquire, Refresh (same
// and other TTL), AutoRefresh (the watchdog's RefreshBatch), Release and a
// second Release, on few keys with short TTLs (pool reuse), with faults
// injected on purpose by count (requests failed unsent: delete, revoke,
// move, the settling read). Checked: every grant and refresh claims no more
// than the server's expiry of the lease its key is on, and a lease none of
// whose operations failed is never lost, nor is a key granted while such a
// lease holds it.
func TestRandomLeaseOps(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	d, l := ownDriver(t, eps)
	seed := int64(20)
	if v, err := strconv.ParseInt(os.Getenv("REVIEW_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d", seed)
	var counts sync.Map
	every := map[string]int64{
		"deleting the lock key":              5,
		"revoking a lease":                   3,
		"moving the lock key to a new lease": 3,
		"settling a move of the lock key":    2,
		"leaving the queue":                  4,
	}
	injectFault(d, func(doing string, _ clientv3.LeaseID) error {
		n, ok := every[doing]
		if !ok {
			return nil
		}
		c, _ := counts.LoadOrStore(doing, new(atomic.Int64))
		if c.(*atomic.Int64).Add(1)%n == 0 {
			return errors.New("test: " + doing + " failed unsent")
		}
		return nil
	})
	type held struct {
		le      *dlock.Lease
		faulted atomic.Bool
	}
	var mu sync.Mutex
	holder := map[string]*held{}
	keys := []string{uniqueKey(t), uniqueKey(t)}
	check := func(h *held, when string) {
		bl := backendLease(t, h.le)
		var own etcd.Ownership
		bl.(interface{ As(any) bool }).As(&own)
		resp, err := admin.Get(t.Context(), own.Key)
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != own.CreateRevision {
			if !h.faulted.Load() {
				t.Errorf("%s: the key of a lease with no failed operation is gone (Err %v)", when, h.le.Err())
			}
			return
		}
		on := clientv3.LeaseID(resp.Kvs[0].Lease)
		asked := time.Now()
		ttl, err := admin.TimeToLive(t.Context(), on)
		if err != nil {
			return
		}
		claim := bl.(backend.Anchored).Anchor().Add(bl.TTL())
		if serverEnd := asked.Add(time.Duration(ttl.TTL+1) * time.Second); claim.After(serverEnd) && h.le.Err() == nil {
			t.Errorf("%s: Anchor+TTL (TTL %v) is %v after the server's expiry of lease %x its key is on (the lease names %x; faulted %v)",
				when, bl.TTL(), claim.Sub(serverEnd).Round(time.Millisecond), on, own.Lease, h.faulted.Load())
		}
		if serverEnd := asked.Add(time.Duration(ttl.TTL+1) * time.Second); h.le.Deadline().After(serverEnd) && h.le.Err() == nil {
			t.Errorf("%s: Deadline is %v after the server's expiry of lease %x (faulted %v)",
				when, h.le.Deadline().Sub(serverEnd).Round(time.Millisecond), on, h.faulted.Load())
		}
	}
	var wg sync.WaitGroup
	end := time.Now().Add(20 * time.Second)
	for w := range 4 {
		wg.Go(func() {
			r := newRand(seed*10 + int64(w))
			for time.Now().Before(end) && !t.Failed() {
				key := keys[r.Intn(len(keys))]
				ttl := time.Duration(3+r.Intn(2)) * time.Second
				ao := &dlock.AcquireOptions{TTL: ttl, AutoRefresh: r.Intn(2) == 0}
				ctx, cancel := contextTimeout(t, 10*time.Second)
				var le *dlock.Lease
				var err error
				if r.Intn(3) == 0 {
					le, err = l.TryAcquire(ctx, key, ao)
				} else {
					le, err = l.Acquire(ctx, key, ao)
				}
				cancel()
				if err != nil {
					continue
				}
				h := &held{le: le}
				mu.Lock()
				if p := holder[key]; p != nil && !p.faulted.Load() && p.le.Err() == nil {
					t.Errorf("key %s granted (token %d) while lease %d, with no failed operation, holds it (its Deadline %v ahead)",
						key, le.Token(), p.le.Token(), time.Until(p.le.Deadline()).Round(time.Millisecond))
				}
				holder[key] = h
				mu.Unlock()
				check(h, "a grant")
				for range r.Intn(4) {
					time.Sleep(time.Duration(r.Intn(400)) * time.Millisecond)
					if err := le.Err(); err != nil {
						if !h.faulted.Load() {
							t.Errorf("a lease with no failed operation was lost: %v", err)
						}
						break
					}
					nt := ttl
					if r.Intn(3) == 0 {
						nt = time.Duration(3+r.Intn(3)) * time.Second
					}
					if err := le.Refresh(t.Context(), nt); err != nil {
						h.faulted.Store(true)
						continue
					}
					check(h, "a refresh")
				}
				mu.Lock()
				if holder[key] == h {
					delete(holder, key)
				}
				mu.Unlock()
				if err := le.Release(t.Context()); err != nil {
					h.faulted.Store(true)
					if !errors.Is(err, dlock.ErrNotHeld) {
						_ = le.Release(t.Context())
					}
				}
			}
		})
	}
	wg.Wait()
	injectFault(d, nil)
	counts.Range(func(k, v any) bool { t.Logf("%s: %d requests", k, v.(*atomic.Int64).Load()); return true })
	t.Logf("pool size at the end: %d", poolSize(d))
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

func contextTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}
