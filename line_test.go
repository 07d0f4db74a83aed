package dlock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memory"
)

// countingDriver is a memory driver (which wakes waiters on release) that
// counts acquire attempts.
type countingDriver struct {
	*memory.Driver
	attempts atomic.Int64
}

func (d *countingDriver) TryAcquire(ctx context.Context, key string, ttl time.Duration) (backend.Lease, error) {
	d.attempts.Add(1)
	return d.Driver.TryAcquire(ctx, key, ttl)
}

// Draining many waiters of one Locker on one key costs O(n) attempts: only
// the head of the Locker's line attempts when a release wakes it, and a
// waiter that arrives behind others makes no attempt of its own. (Before,
// every release woke every waiter and each made an attempt, n²/2 in all:
// this test saw 20,033 attempts and 200 watches for 200 waiters; now 399.)
func TestWaitersSingleFlight(t *testing.T) {
	const n = 200
	s := memory.NewStore()
	d := &countingDriver{Driver: memory.NewDriver(s)}
	l := dlock.New(d, nil)
	defer l.Close()
	ctx := t.Context()
	ao := &dlock.AcquireOptions{TTL: time.Minute}
	first, err := l.TryAcquire(ctx, "k", ao)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		order []int
		mu    sync.Mutex
	)
	for i := range n {
		wg.Go(func() {
			le, err := l.Acquire(ctx, "k", ao)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(time.Millisecond) // hold it: the others find it held
			if err := le.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	// Until a watch is in force, then a while for the rest to join.
	for deadline := time.Now().Add(10 * time.Second); s.Waiters("k") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no waiter watches the key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if w := s.Waiters("k"); w != 1 {
		t.Errorf("%d watches on the key, want 1 (the line's)", w)
	}
	d.attempts.Store(0)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got := d.attempts.Load()
	t.Logf("%d waiters drained with %d attempts", n, got)
	if got > 3*n {
		t.Errorf("%d waiters drained with %d attempts, want at most %d (3 per acquisition)", n, got, 3*n)
	}
	if len(order) != n {
		t.Fatalf("%d of %d waiters acquired", len(order), n)
	}
	if w := s.Waiters("k"); w != 0 {
		t.Errorf("%d watches left after the line emptied", w)
	}
}
