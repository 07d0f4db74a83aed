package check_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/memory"
)

// run has clients contend for one key through lockers (client i uses
// lockers[i%len]), each updating a fenced register inside its critical
// section, and returns the checker's verdict.
func run(t *testing.T, lockers []*dlock.Locker) []check.Violation {
	t.Helper()
	h := check.NewHistory()
	reg := check.NewRegister(h, "k")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d", i)
			for range 5 {
				le, err := h.Acquire(t.Context(), name, lockers[i%len(lockers)], "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				reg.Update(t.Context(), le, time.Millisecond)
				if err := le.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	return check.Check(h, check.Options{Progress: 5 * time.Second})
}

// Recorded through History on a real lock, the workload is clean; on two
// lockers that do not share their state (a broken lock), the checker
// reports the overlap and the lost updates.
func TestRecordedWorkload(t *testing.T) {
	defer goleak.VerifyNone(t)
	store := memory.NewStore()
	a, b := newMem(t, store), newMem(t, store)
	defer a.Close()
	defer b.Close()
	if vs := run(t, []*dlock.Locker{a, b}); len(vs) != 0 {
		t.Errorf("violations on a working lock:\n%s", check.Summary(vs))
	}

	x, y := newMem(t, memory.NewStore()), newMem(t, memory.NewStore())
	defer x.Close()
	defer y.Close()
	vs := run(t, []*dlock.Locker{x, y})
	found := map[check.Property]bool{}
	for _, v := range vs {
		found[v.Property] = true
	}
	if !found[check.MutualExclusion] {
		t.Errorf("two stores, no mutual exclusion violation found:\n%s", check.Summary(vs))
	}
	// Both stores start their tokens at the same place: a fenced register
	// accepts the equal tokens of the other store's holders, or refuses
	// their writes; equal accepted tokens are stale writes.
	if !found[check.StaleWrite] && !found[check.LostUpdate] && !found[check.TokenOrder] {
		t.Errorf("two stores: neither stale write, lost update nor token order violation found:\n%s", check.Summary(vs))
	}
}

// newMem is memory.New with default Options.
func newMem(t *testing.T, s *memory.Store) *dlock.Locker {
	t.Helper()
	l, err := memory.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Lease.Refresh records a Refresh that succeeded, with the Deadline after
// it.
func TestRefreshRecorded(t *testing.T) {
	defer goleak.VerifyNone(t)
	l := newMem(t, memory.NewStore())
	defer l.Close()
	h := check.NewHistory()
	le, err := h.Acquire(t.Context(), "c", l, "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := le.Refresh(t.Context(), time.Second); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	var refreshes []check.Op
	for _, op := range h.Ops() {
		if op.Kind == check.Refresh {
			refreshes = append(refreshes, op)
		}
	}
	if len(refreshes) != 1 || refreshes[0].Lease != le.ID() || !refreshes[0].Deadline.Equal(le.Deadline()) || refreshes[0].End.Before(refreshes[0].Start) {
		t.Fatalf("Refresh ops = %+v: want one, of lease %d, with Deadline %v", refreshes, le.ID(), le.Deadline())
	}
	if err := le.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
