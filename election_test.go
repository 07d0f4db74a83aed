package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
)

// fdrv wraps a memory driver: it can fail, delay, and it records any call
// made after Close.
type fdrv struct {
	t          testing.TB
	d          *memory.Driver
	closed     atomic.Bool
	afterClose atomic.Int64

	fail         atomic.Bool  // TryAcquire/Inspect fail with ErrUnavailable
	grantDelay   atomic.Int64 // ns slept after a successful grant
	releaseDelay atomic.Int64 // ns slept after a successful release (reply latency)
	tries        atomic.Int64
	failRefresh  atomic.Bool
	loseAtOnce   atomic.Bool
	inspects     atomic.Int64
}

func (f *fdrv) chk(op string) {
	if f.closed.Load() {
		f.afterClose.Add(1)
		f.t.Errorf("backend call %s after Driver.Close", op)
	}
}
func (f *fdrv) TryAcquire(ctx context.Context, r backend.Request) (backend.Lease, error) {
	f.chk("TryAcquire")
	f.tries.Add(1)
	if f.fail.Load() {
		return nil, backend.ErrUnavailable
	}
	bl, err := f.d.TryAcquire(ctx, r)
	if err != nil {
		return nil, err
	}
	if d := f.grantDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return &flease{f: f, Lease: bl}, nil
}
func (f *fdrv) ValidateKey(k string) error     { return nil }
func (f *fdrv) Limits() backend.Limits         { return f.d.Limits() }
func (f *fdrv) Guarantees() backend.Guarantees { return f.d.Guarantees() }
func (f *fdrv) Close() error                   { f.closed.Store(true); return nil }
func (f *fdrv) Watch(ctx context.Context, k string) (<-chan struct{}, func(), error) {
	f.chk("Watch")
	ch, stop, err := f.d.Watch(ctx, k)
	return ch, func() { f.chk("Watch.stop"); stop() }, err
}

// inspecting adds backend.Inspector.
type inspecting struct{ *fdrv }

func (f inspecting) Inspect(ctx context.Context, k string) (backend.LockInfo, error) {
	f.chk("Inspect")
	f.inspects.Add(1)
	if f.fail.Load() {
		return backend.LockInfo{}, backend.ErrUnavailable
	}
	return f.d.Inspect(ctx, k)
}
func (f inspecting) Keys(ctx context.Context, n int) ([]string, error) { return f.d.Keys(ctx, n) }

type flease struct {
	f *fdrv
	backend.Lease
}

func (l *flease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	l.f.chk("Refresh")
	if l.f.failRefresh.Load() {
		return 0, backend.ErrUnavailable
	}
	return l.Lease.Refresh(ctx, ttl)
}
func (l *flease) Release(ctx context.Context) error {
	l.f.chk("Release")
	err := l.Lease.Release(ctx)
	if d := l.f.releaseDelay.Load(); d > 0 && err == nil {
		time.Sleep(time.Duration(d))
	}
	return err
}
func (l *flease) NotifyLoss(fn func(error)) {
	if l.f.loseAtOnce.Load() {
		fn(backend.ErrLeaseLost) // the backend reports the lease lost at once (session gone)
		return
	}
	l.Lease.(backend.LossNotifier).NotifyLoss(fn)
}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func newFlaky(t testing.TB, s *memory.Store) *fdrv { return &fdrv{t: t, d: memory.NewDriver(s)} }

func electionLocker(t testing.TB, d backend.Driver, o *dlock.Options) *dlock.Locker {
	t.Helper()
	l, err := driver.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func bufLogger(b *logBuf) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// cwDrv: an Inspector and ChangeWatcher whose watch ends by itself at once
// (a legal behaviour: the channel is closed when the watch ends by itself).
type cwDrv struct {
	inspecting
	watches atomic.Int64
}

func (c *cwDrv) WatchChanges(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	c.watches.Add(1)
	ch := make(chan struct{})
	close(ch)
	return ch, func() {}, nil
}

// Close while leading cancels the leader's context before it gives the
// lease back: the next leader never starts while this one's context is
// live. (Seen red before Lease.release ended the contexts first.)
func TestElectionCloseEndsLeadFirst(t *testing.T) {
	s := memory.NewStore()
	fa := newFlaky(t, s)
	fa.releaseDelay.Store(int64(300 * time.Millisecond)) // the release's reply takes 300 ms
	la := electionLocker(t, inspecting{fa}, nil)
	lb := electionLocker(t, memory.NewDriver(s), nil)
	defer lb.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	aCtx := make(chan context.Context, 1)
	ea, err := dlock.NewElection(la, "k", &dlock.ElectionOptions{TTL: 10 * time.Second, Holder: "a"})
	if err != nil {
		t.Fatal(err)
	}
	go ea.Run(ctx, func(ctx context.Context, le *dlock.Lease) error {
		aCtx <- ctx
		<-ctx.Done()
		return nil
	})
	actx := <-aCtx
	bIn := make(chan error, 1)
	eb, err := dlock.NewElection(lb, "k", &dlock.ElectionOptions{TTL: 10 * time.Second, Holder: "b"})
	if err != nil {
		t.Fatal(err)
	}
	go eb.Run(ctx, func(ctx context.Context, le *dlock.Lease) error {
		bIn <- actx.Err()
		<-ctx.Done()
		return nil
	})
	time.Sleep(100 * time.Millisecond) // b waits in line
	go la.Close()
	select {
	case err := <-bIn:
		if err == nil {
			t.Error("b was elected while a's lead context was still live")
		} else if cause := context.Cause(actx); !errors.Is(cause, dlock.ErrClosed) {
			t.Errorf("a's lead context ended with cause %v, want ErrClosed", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b not elected")
	}
}

// Close while campaigning and observing: Run returns ErrClosed, OnLeader is
// not called after that, no backend call follows Driver.Close (fdrv fails
// the test on one), and Run after Close returns ErrClosed.
func TestElectionCloseWhileCampaigning(t *testing.T) {
	s := memory.NewStore()
	holder := electionLocker(t, memory.NewDriver(s), nil)
	defer holder.Close()
	le, err := holder.Acquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(t.Context())
	f := newFlaky(t, s)
	l := electionLocker(t, inspecting{f}, &dlock.Options{RetryMax: 20 * time.Millisecond})
	var calls atomic.Int64
	e, err := dlock.NewElection(l, "k", &dlock.ElectionOptions{OnLeader: func(dlock.LockInfo) { calls.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- e.Run(t.Context(), func(ctx context.Context, _ *dlock.Lease) error { <-ctx.Done(); return nil })
	}()
	time.Sleep(200 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if calls.Load() == 0 {
		t.Error("OnLeader was never called")
	}
	n := calls.Load()
	time.Sleep(100 * time.Millisecond)
	if calls.Load() != n {
		t.Error("OnLeader called after Run returned")
	}
	if err := e.Run(t.Context(), func(context.Context, *dlock.Lease) error { return nil }); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
}

// A lead that panics gives the lease back (the panic goes on): another
// candidate is elected. (Seen red before the term's clean-up was deferred:
// the watchdog kept the lease forever.)
func TestElectionLeadPanicGivesLeaseBack(t *testing.T) {
	s := memory.NewStore()
	la := electionLocker(t, memory.NewDriver(s), nil)
	lb := electionLocker(t, memory.NewDriver(s), nil)
	defer lb.Close()
	defer la.Close()
	ttl := 100 * time.Millisecond
	ea, err := dlock.NewElection(la, "k", &dlock.ElectionOptions{TTL: ttl, Holder: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var leadCtx context.Context
	func() {
		defer func() {
			if r := recover(); r != "bug in lead" {
				t.Errorf("recovered %v, want the panic of lead", r)
			}
		}()
		ea.Run(t.Context(), func(ctx context.Context, _ *dlock.Lease) error {
			leadCtx = ctx
			panic("bug in lead")
		})
	}()
	if leadCtx.Err() == nil {
		t.Error("the panicked lead's context is still live")
	}
	eb, err := dlock.NewElection(lb, "k", &dlock.ElectionOptions{TTL: ttl, Holder: "b"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*ttl)
	defer cancel()
	elected := false
	eb.Run(ctx, func(ctx context.Context, _ *dlock.Lease) error { elected = true; cancel(); return nil })
	if !elected {
		info, _ := eb.Leader(t.Context())
		t.Errorf("b not elected within 5 TTLs after a's lead panicked; Leader() = %+v", info)
	}
}

// A backend that loses every lease as soon as it grants it: Run backs off
// rather than spin (seen red: 6,548 terms in a second), and never calls
// lead for a term that is over before it began (seen red: a review found
// dlock run --elect starting its command for such terms).
func TestElectionImmediateLossBacksOff(t *testing.T) {
	f := newFlaky(t, memory.NewStore())
	f.loseAtOnce.Store(true)
	l := electionLocker(t, inspecting{f}, &dlock.Options{Logger: bufLogger(new(logBuf))})
	defer l.Close()
	e, err := dlock.NewElection(l, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	terms := 0
	e.Run(ctx, func(lctx context.Context, le *dlock.Lease) error { terms++; <-lctx.Done(); return nil })
	if n := f.tries.Load(); n > 20 {
		t.Errorf("Run spins: %d acquires in 1 s", n)
	}
	if terms != 0 {
		t.Errorf("lead was called for %d terms lost at their grant", terms)
	}
}

// A lead that releases its lease itself has given leadership up: its
// context's cause matches ErrNotHeld, and Run pauses before it campaigns
// again (2 × RetryMax, 1 s here). (Seen red: 6,668 terms in 0.5 s.)
func TestElectionLeadReleasesLease(t *testing.T) {
	l := electionLocker(t, memory.NewDriver(memory.NewStore()), nil)
	defer l.Close()
	e, err := dlock.NewElection(l, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	terms := 0
	e.Run(ctx, func(lctx context.Context, le *dlock.Lease) error {
		terms++
		if err := le.Release(lctx); err != nil {
			t.Errorf("Release: %v", err)
		}
		<-lctx.Done()
		if cause := context.Cause(lctx); !errors.Is(cause, dlock.ErrNotHeld) {
			t.Errorf("cause after lead's own Release = %v, want one matching ErrNotHeld", cause)
		}
		return nil
	})
	if terms != 1 {
		t.Errorf("%d terms in 0.5 s, want 1 (the pause after giving up is 1 s)", terms)
	}
}

// OnLeader on a backend that cannot inspect its locks is refused before any
// I/O. (Seen red: accepted, and never called.)
func TestElectionOnLeaderWithoutInspector(t *testing.T) {
	f := newFlaky(t, memory.NewStore())
	l := electionLocker(t, f, nil) // *fdrv has no Inspect
	defer l.Close()
	_, err := dlock.NewElection(l, "k", &dlock.ElectionOptions{OnLeader: func(dlock.LockInfo) {}})
	if !errors.Is(err, dlock.ErrInvalidConfig) || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("NewElection with OnLeader on a backend without Inspect: %v, want ErrInvalidConfig and errors.ErrUnsupported", err)
	}
	if f.tries.Load() != 0 {
		t.Error("NewElection made a backend call")
	}
}

// A change watch that ends as soon as it starts does not make the observer
// spin. (Seen red: 86,760 Inspects in a second.)
func TestElectionObserverWatchEndsAtOnce(t *testing.T) {
	f := newFlaky(t, memory.NewStore())
	d := &cwDrv{inspecting: inspecting{f}}
	l := electionLocker(t, d, nil) // RetryMax 500 ms
	defer l.Close()
	e, err := dlock.NewElection(l, "k", &dlock.ElectionOptions{OnLeader: func(dlock.LockInfo) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	e.Run(ctx, func(ctx context.Context, _ *dlock.Lease) error { <-ctx.Done(); return nil })
	if n := f.inspects.Load(); n > 10 {
		t.Errorf("%d Inspects and %d WatchChanges in 1 s", n, d.watches.Load())
	}
}

// Close while Run pauses after giving leadership up ends Run at once, with
// ErrClosed. (Seen red: Run slept out its 10 s pause.)
func TestElectionCloseDuringPause(t *testing.T) {
	l := electionLocker(t, memory.NewDriver(memory.NewStore()), &dlock.Options{RetryMax: 5 * time.Second})
	e, err := dlock.NewElection(l, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- e.Run(t.Context(), func(ctx context.Context, _ *dlock.Lease) error { return nil }) // gives up at once
	}()
	time.Sleep(100 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("Run still running 2 s after Locker.Close")
		<-done
	}
}
