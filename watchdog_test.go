package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memory"
)

// batchDriver is a memory driver that refreshes through
// backend.BatchRefresher and counts the batches and the leases in them.
type batchDriver struct {
	backend.Driver
	mu      sync.Mutex
	batches int
	leases  int
	largest int
}

func (d *batchDriver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	d.mu.Lock()
	d.batches++
	d.leases += len(reqs)
	d.largest = max(d.largest, len(reqs))
	d.mu.Unlock()
	for i := range reqs {
		r := &reqs[i]
		r.Granted, r.Err = r.Lease.Refresh(ctx, r.TTL)
	}
}

func (d *batchDriver) counts() (batches, leases, largest int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.batches, d.leases, d.largest
}

// Many auto-refreshed leases on one Locker cost O(1) goroutines, are
// refreshed in batches through the driver's BatchRefresher, and none is
// lost. (Before the Locker-wide watchdog, every lease had a goroutine of
// its own and was refreshed alone: this test saw 2,000 more goroutines and
// no batch.)
func TestWatchdogBatchesRefreshes(t *testing.T) {
	const n = 2000
	d := &batchDriver{Driver: memory.NewDriver(memory.NewStore())}
	l := mustNew(t, d, nil)
	defer l.Close()
	before := runtime.NumGoroutine()
	ao := &dlock.AcquireOptions{TTL: 600 * time.Millisecond, AutoRefresh: true, MaxHold: time.Hour}
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		le, err := l.TryAcquire(t.Context(), fmt.Sprintf("k%d", i), ao)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = le
		le.Done() // a deadline timer, as a holder that watches Done has
	}
	// Until every lease has been refreshed three times over (the TTL is
	// 600 ms, refreshed every 200 ms).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, refreshed, _ := d.counts()
		if refreshed >= 3*n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d refreshes of %d leases in 30 s", refreshed, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if grown := runtime.NumGoroutine() - before; grown > 2*maxBatchesForTest {
		t.Errorf("%d auto-refreshed leases added %d goroutines, want O(1)", n, grown)
	}
	for i, le := range leases {
		if err := le.Err(); err != nil {
			t.Fatalf("lease %d ended: %v", i, err)
		}
	}
	batches, refreshed, largest := d.counts()
	t.Logf("%d refreshes in %d batches (largest %d)", refreshed, batches, largest)
	if largest < 2 {
		t.Errorf("no batch refreshed more than one lease (%d refreshes in %d batches)", refreshed, batches)
	}
	for _, le := range leases {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// maxBatchesForTest bounds the goroutines the watchdog may add: its loop
// and the batches in flight.
const maxBatchesForTest = 10

// slowBatchDriver is a memory driver whose batches take delay, like a
// batch of many refreshes on a loaded server; it records whether a batch
// was cancelled before it was done.
type slowBatchDriver struct {
	batchDriver
	delay     time.Duration
	entered   chan struct{} // receives when a batch begins
	cancelled atomic.Int32
	marked    atomic.Bool // a batch with a lease of token 2 (the marked lease) has been refreshed
}

func (d *slowBatchDriver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	select {
	case d.entered <- struct{}{}:
	default:
	}
	select {
	case <-time.After(d.delay):
		d.batchDriver.RefreshBatch(ctx, reqs)
		for _, r := range reqs {
			if r.Lease.Token() == 2 {
				d.marked.Store(true)
			}
		}
	case <-ctx.Done():
		d.cancelled.Add(1)
		for i := range reqs {
			reqs[i].Err = fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
		}
	}
}

// A Release waits behind a normal batch of background refreshes that has
// its lease in it, rather than cancel the batch: cancelling at once starved
// the other leases when many were released one after another (every
// release cancelled the batch of the others; the 10,000-lease workload of
// bench/ lost dozens of leases while it released them). Seen failing with
// the cancel at once: the batch was cancelled.
func TestReleaseWaitsForNormalBatch(t *testing.T) {
	d := &slowBatchDriver{batchDriver: batchDriver{Driver: memory.NewDriver(memory.NewStore())}, delay: 100 * time.Millisecond, entered: make(chan struct{}, 1)}
	l := mustNew(t, d, nil)
	defer l.Close()
	// TTL 3 s: the batch's patience is 500 ms, well past its 100 ms.
	ao := &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true}
	// The key of leases[0] is taken once before: its token, 2, tells its
	// batch from the others (token 1).
	first, err := l.TryAcquire(t.Context(), "k0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	var leases []*dlock.Lease
	for i := range 10 {
		le, err := l.TryAcquire(t.Context(), fmt.Sprintf("k%d", i), ao)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
	}
	select {
	case <-d.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch in 10 s")
	}
	if err := leases[0].Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := d.cancelled.Load(); n != 0 {
		t.Errorf("the Release cancelled the batch of refreshes its lease was in (%d batches cancelled)", n)
	}
	// The Release returned after the batch its lease was in. (The ten
	// leases share one batch unless acquiring them took longer than the
	// batching window, a tenth of the 1 s interval, as on a loaded
	// machine; the batch that entered first is then not always leases[0]'s.)
	if leases[0].Token() != 2 {
		t.Fatalf("leases[0] has token %d, want 2", leases[0].Token())
	}
	if !d.marked.Load() {
		t.Error("the Release returned before the batch of refreshes its lease was in had finished")
	}
	for _, le := range leases[1:] {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// hangingBatchDriver is a memory driver whose batches of refreshes hang
// until their ctx ends; it reports each batch's size when it begins and
// its ctx's error when it ends.
type hangingBatchDriver struct {
	*memory.Driver
	entered chan int
	ended   chan error
}

func (d *hangingBatchDriver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	d.entered <- len(reqs)
	<-ctx.Done()
	for i := range reqs {
		reqs[i].Err = fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
	}
	d.ended <- ctx.Err()
}

// hangingBatchOfTwo acquires two auto-refreshed leases (TTL 3 s: the
// batch's patience is 500 ms) and waits until their first batch of
// refreshes hangs in d.
func hangingBatchOfTwo(t *testing.T) (*memory.Store, *hangingBatchDriver, *dlock.Locker, [2]*dlock.Lease) {
	t.Helper()
	s := memory.NewStore()
	d := &hangingBatchDriver{Driver: memory.NewDriver(s), entered: make(chan int, 10), ended: make(chan error, 10)}
	l := mustNew(t, d, nil)
	t.Cleanup(func() { l.Close() })
	ao := &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true}
	var leases [2]*dlock.Lease
	for i := range leases {
		le, err := l.TryAcquire(t.Context(), fmt.Sprintf("k%d", i), ao)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = le
	}
	select {
	case n := <-d.entered:
		if n != 2 {
			t.Fatalf("a batch of %d leases, want both (acquired within a tenth of their refresh interval)", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no batch in 10 s")
	}
	return s, d, l, leases
}

// A lease that ends while its batch of refreshes is in flight (here the
// backend reports it lost) does not cancel the batch: nobody waits for it,
// and cancelling it would fail the refreshes of the others (the Release
// patience exists for a Release that waits behind the batch). The batch
// here ends at its own deadline. Seen failing before the fix: the batch
// was cancelled (context.Canceled) half a second after the loss of one
// lease.
func TestLossInBatchDoesNotCancelIt(t *testing.T) {
	s, d, _, leases := hangingBatchOfTwo(t)
	if !s.Expire("k0") {
		t.Fatal("k0 not held")
	}
	select {
	case <-leases[0].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lost lease's Done did not fire in 10 s")
	}
	select {
	case err := <-d.ended:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the batch ended with %v, want its deadline (the loss of one lease cancelled the refreshes of the others)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the batch did not end in 20 s")
	}
}

// A Release of a lease that was lost while its batch of refreshes hangs
// still waits only for the batch's patience, then cancels it: Release never
// waits behind a hanging refresh, even when the lease ended before.
func TestReleaseOfLostLeaseCancelsHangingBatch(t *testing.T) {
	s, d, _, leases := hangingBatchOfTwo(t)
	if !s.Expire("k0") {
		t.Fatal("k0 not held")
	}
	<-leases[0].Done()
	if err := leases[0].Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a lost lease: %v, want ErrNotHeld", err)
	}
	select {
	case err := <-d.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the batch ended with %v, want cancelled by the Release", err)
		}
	default:
		t.Error("Release returned while the batch with its lease was still in flight")
	}
}

// shortDriver is a memory driver that grants a tenth of every TTL asked,
// on acquire and on refresh, and says so (the lease's TTL and Refresh's
// result are what it granted), as a backend does that hands out what is
// left of a reused server lease.
type shortDriver struct{ backend.Driver }

func (d shortDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	req.TTL /= 10
	l, err := d.Driver.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return shortLease{l}, nil
}

type shortLease struct{ backend.Lease }

func (l shortLease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	return l.Lease.Refresh(ctx, ttl/10)
}

// The watchdog refreshes by the lease's real Deadline, not by the TTL
// asked: a backend that grants less than asked (here a tenth: 3s asked,
// 300ms granted) still has its auto-refreshed lease renewed in time. Before,
// the first refresh was due a third of the TTL asked (1s) after the grant,
// 700ms after the lease had run out.
func TestWatchdogFollowsShortGrant(t *testing.T) {
	l := mustNew(t, shortDriver{memory.NewDriver(memory.NewStore())}, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := le.TTL(); got != 300*time.Millisecond {
		t.Fatalf("TTL %v, want the 300ms granted", got)
	}
	// Ten grants' worth, and more than one interval of the TTL asked.
	select {
	case <-le.Done():
		t.Fatalf("the auto-refreshed lease ended: %v", le.Err())
	case <-time.After(3 * time.Second):
	}
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// An auto-refreshed lease refreshed by hand to a TTL shorter than a third of
// the TTL asked is refreshed by the watchdog before that runs out: the
// watchdog's next refresh is brought forward to the new Deadline. (Before,
// it kept the schedule of the TTL asked, 1s after the last refresh, and the
// 200ms lease ran out first.)
func TestWatchdogFollowsShorterRefresh(t *testing.T) {
	l := mustNew(t, memory.NewDriver(memory.NewStore()), nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Refresh(t.Context(), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
		t.Fatalf("the auto-refreshed lease ended after a Refresh to 200ms: %v", le.Err())
	case <-time.After(2 * time.Second):
	}
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// The same when the Refresh by hand fails with an unknown outcome: the
// Deadline was pulled in to the shorter TTL (the server may have applied
// it), and the watchdog's next refresh must come before that, not at its
// old time.
func TestWatchdogFollowsFailedShorterRefresh(t *testing.T) {
	d := &flakyDriver{Driver: memory.NewDriver(memory.NewStore())}
	l := mustNew(t, d, nil)
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	d.lostReply.Store(true) // applied, but the reply is lost
	if err := le.Refresh(t.Context(), 300*time.Millisecond); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Refresh with its reply lost: %v, want ErrUnavailable", err)
	}
	d.lostReply.Store(false)
	select {
	case <-le.Done():
		t.Fatalf("the auto-refreshed lease ended after a failed Refresh to 300ms: %v", le.Err())
	case <-time.After(2 * time.Second):
	}
	if err := le.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}
