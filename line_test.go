package dlock_test

import (
	"context"
	"fmt"
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

func (d *countingDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	d.attempts.Add(1)
	return d.Driver.TryAcquire(ctx, req)
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
	l := mustNew(t, d, nil)
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

// gatedDriver is a memory driver (which wakes waiters on release) whose
// TryAcquire calls can be held: a call for which gate returns a channel
// makes its attempt, then waits for that channel to close (or its ctx to
// end) before it returns the outcome.
type gatedDriver struct {
	*memory.Driver
	gate func(ctx context.Context) chan struct{}
}

func (d *gatedDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	bl, err := d.Driver.TryAcquire(ctx, req)
	if g := d.gate(ctx); g != nil {
		select {
		case <-g:
		case <-ctx.Done():
			if err == nil {
				_ = bl.Release(context.WithoutCancel(ctx))
			}
			return nil, fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
		}
	}
	return bl, err
}

type waiterKey struct{}

// A waiter that made its first attempt before it joined the line, behind a
// head, attempts at once when its turn comes: the attempt it made is stale
// by then, and a release that the line's watch reported before its turn
// must not be thrown away. Here the head's context ends during an attempt
// that found the key held, after the holder released (the watch's wake-up
// is pending, the key is free), and the next waiter made its attempt
// before it joined the line. Seen failing before the fix: the new head
// drained the pending wake-up without an attempt and waited for the
// fallback poll (Options.RetryMax, an hour here), though the key was free.
func TestLineNewHeadAttemptsAfterStaleAttempt(t *testing.T) {
	s := memory.NewStore()
	var (
		mu    sync.Mutex
		gates = map[string]chan struct{}{} // by waiter, the gate of its next attempt
		calls = map[string]int{}
		held  = make(chan string, 4) // a waiter's attempt is held at its gate
	)
	d := &gatedDriver{Driver: memory.NewDriver(s), gate: func(ctx context.Context) chan struct{} {
		who, _ := ctx.Value(waiterKey{}).(string)
		mu.Lock()
		defer mu.Unlock()
		calls[who]++
		// w2's first attempt and w1's second (its first as head, right
		// after its watch) are held.
		if (who == "w2" && calls[who] == 1) || (who == "w1" && calls[who] == 2) {
			g := make(chan struct{})
			gates[who] = g
			held <- who
			return g
		}
		return nil
	}}
	l := mustNew(t, d, &dlock.Options{RetryMax: time.Hour})
	defer l.Close()
	ao := &dlock.AcquireOptions{TTL: time.Minute}
	holder, err := l.TryAcquire(t.Context(), "k", ao)
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	expectHeld := func(who string) {
		t.Helper()
		select {
		case got := <-held:
			if got != who {
				t.Fatalf("attempt of %s held, want %s", got, who)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no attempt of %s in 10 s", who)
		}
	}

	// w2 makes its first attempt (no line yet); it is held there.
	w2done := make(chan error, 1)
	var w2 *dlock.Lease
	go func() {
		var err error
		w2, err = l.Acquire(context.WithValue(t.Context(), waiterKey{}, "w2"), "k", ao)
		w2done <- err
	}()
	expectHeld("w2")
	// w1 finds no line either, attempts, becomes the head, watches, and
	// its next attempt is held (after it found the key held).
	ctx1, cancel1 := context.WithCancel(context.WithValue(t.Context(), waiterKey{}, "w1"))
	defer cancel1()
	w1done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx1, "k", ao)
		w1done <- err
	}()
	expectHeld("w1")
	// w2's attempt returns (the key is held): it joins the line behind w1.
	mu.Lock()
	close(gates["w2"])
	mu.Unlock()
	waitFor("w2 in line", func() bool { return dlock.LineLen(l, "k") == 2 })
	// The holder releases: the line's watch has a wake-up pending.
	if err := holder.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// w1 gives up during its attempt: w2 is the head, the key is free.
	cancel1()
	if err := <-w1done; err == nil {
		t.Fatal("w1 acquired; want its cancellation")
	}
	select {
	case err := <-w2done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("w2 did not acquire the free key in 20 s (a lost wake-up: it waits for the fallback poll)")
	}
	if err := w2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
