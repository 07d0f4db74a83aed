package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
	"github.com/dlock-go/dlock/observe"
)

// recorder is an Observer that records every event, in order.
type recorder struct {
	mu     sync.Mutex
	events []any // the *Event values, in the order of the calls
	// onEvent, if set, is called with each event after it is recorded
	// (outside mu), to call back into the Locker from a hook.
	onEvent func(ctx context.Context, e any)
}

type ctxKey struct{}

func (r *recorder) add(ctx context.Context, e any) {
	r.mu.Lock()
	r.events = append(r.events, e)
	f := r.onEvent
	r.mu.Unlock()
	if f != nil {
		f(ctx, e)
	}
}

func (r *recorder) AcquireStart(ctx context.Context, e observe.AcquireStartEvent) context.Context {
	r.add(ctx, e)
	return context.WithValue(ctx, ctxKey{}, "from AcquireStart")
}

func (r *recorder) AcquireEnd(ctx context.Context, e observe.AcquireEndEvent) {
	if ctx.Value(ctxKey{}) != "from AcquireStart" {
		panic("AcquireEnd did not get the context AcquireStart returned")
	}
	r.add(ctx, e)
}
func (r *recorder) Refresh(ctx context.Context, e observe.RefreshEvent) { r.add(ctx, e) }
func (r *recorder) Release(ctx context.Context, e observe.ReleaseEvent) { r.add(ctx, e) }
func (r *recorder) LeaseEnd(e observe.LeaseEndEvent)                    { r.add(context.Background(), e) }

// all returns the events recorded so far.
func (r *recorder) all() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.events...)
}

// of returns the recorded events of type E.
func of[E any](r *recorder) []E {
	var out []E
	for _, e := range r.all() {
		if e, ok := e.(E); ok {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls until r has recorded n events of type E (generous bound),
// and returns them.
func waitFor[E any](t *testing.T, r *recorder, n int) []E {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if es := of[E](r); len(es) >= n {
			return es
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %T events recorded after 10s, want %d; all events: %+v", len(of[E](r)), *new(E), n, r.all())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// observed returns a Locker on a memory store that reports to a recorder.
func observed(t *testing.T, opts *dlock.Options) (*memory.Store, *dlock.Locker, *recorder) {
	t.Helper()
	s := memory.NewStore()
	r := &recorder{}
	var o dlock.Options
	if opts != nil {
		o = *opts
	}
	o.Observer = r
	l := mustMem(t, s, &o)
	t.Cleanup(func() { l.Close() })
	return s, l, r
}

func TestObserverAcquireRelease(t *testing.T) {
	_, l, r := observed(t, nil)
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := le.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	ends := waitFor[observe.LeaseEndEvent](t, r, 1)

	events := r.all()
	if len(events) != 5 {
		t.Fatalf("events = %+v, want AcquireStart, AcquireEnd, Release, LeaseEnd, Release (5)", events)
	}
	if e := events[0].(observe.AcquireStartEvent); e != (observe.AcquireStartEvent{Backend: "memory", Key: "k", Try: true}) {
		t.Errorf("AcquireStart = %+v", e)
	}
	ae := events[1].(observe.AcquireEndEvent)
	if ae.Backend != "memory" || ae.Key != "k" || !ae.Try || ae.Outcome != observe.AcquireAcquired || ae.Err != nil ||
		ae.Attempts != 1 || ae.Token != le.Token() || ae.Token == 0 || ae.TTL != time.Minute || ae.Wait <= 0 {
		t.Errorf("AcquireEnd = %+v", ae)
	}
	var rels []observe.ReleaseEvent
	for _, e := range events[2:] {
		if e, ok := e.(observe.ReleaseEvent); ok {
			rels = append(rels, e)
		}
	}
	if len(rels) != 2 {
		t.Fatalf("Release events = %+v, want 2", rels)
	}
	if e := rels[0]; e.Backend != "memory" || e.Key != "k" || e.Token != le.Token() || e.Outcome != observe.ReleaseReleased || e.Err != nil || e.Duration <= 0 {
		t.Errorf("first Release = %+v", e)
	}
	if e := rels[1]; e.Outcome != observe.ReleaseNotHeld || !errors.Is(e.Err, dlock.ErrNotHeld) {
		t.Errorf("second Release = %+v, want not_held", e)
	}
	if e := ends[0]; e.Backend != "memory" || e.Key != "k" || e.Token != le.Token() || e.Reason != observe.EndReleased ||
		e.Reason.Lost() || !errors.Is(e.Err, dlock.ErrNotHeld) || e.Held <= 0 {
		t.Errorf("LeaseEnd = %+v", e)
	}
}

func TestObserverAcquireOutcomes(t *testing.T) {
	_, l, r := observed(t, &dlock.Options{RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
	holder, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}

	// Held elsewhere: not acquired, one attempt.
	if _, err := l.TryAcquire(t.Context(), "k", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v", err)
	}
	// The caller's deadline ends the wait: cancelled.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	deadline, _ := ctx.Deadline()
	callStart := time.Now() // after the deadline was set: the call's Wait is at least deadline-callStart
	_, err = l.Acquire(ctx, "k", nil)
	callTook := time.Since(callStart)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a deadline = %v", err)
	}
	// Bad input: error, no attempt.
	if _, err := l.TryAcquire(t.Context(), "", nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquire of an empty key = %v", err)
	}
	// A wait that ends with the lock: several attempts.
	go func() {
		time.Sleep(20 * time.Millisecond)
		holder.Release(context.Background())
	}()
	le, err := l.Acquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	le.Release(t.Context())

	ends := of[observe.AcquireEndEvent](r)
	if len(ends) != 5 {
		t.Fatalf("AcquireEnd events = %+v, want 5", ends)
	}
	want := []struct {
		try      bool
		outcome  observe.AcquireOutcome
		attempts func(int) bool
	}{
		{true, observe.AcquireAcquired, func(n int) bool { return n == 1 }},
		{true, observe.AcquireNotAcquired, func(n int) bool { return n == 1 }},
		{false, observe.AcquireCancelled, func(n int) bool { return n >= 1 }},
		{true, observe.AcquireError, func(n int) bool { return n == 0 }},
		{false, observe.AcquireAcquired, func(n int) bool { return n >= 2 }},
	}
	for i, w := range want {
		e := ends[i]
		if e.Try != w.try || e.Outcome != w.outcome || !w.attempts(e.Attempts) || (e.Outcome == observe.AcquireAcquired) != (e.Err == nil) {
			t.Errorf("AcquireEnd %d = %+v, want Try %v, Outcome %v", i, e, w.try, w.outcome)
		}
	}
	// The Locker's clock starts inside the call, after the context's:
	// its Wait lies between what was left of the deadline when the call
	// began and the call's whole time.
	if w, least := ends[2].Wait, deadline.Sub(callStart); w < least || w > callTook {
		t.Errorf("the cancelled wait was reported as %v, want between %v (the deadline) and %v (the call)", w, least, callTook)
	}
	if ends[4].Token <= ends[0].Token {
		t.Errorf("token of the second holder %d, first %d", ends[4].Token, ends[0].Token)
	}

	// Bad input with a context that has ended already: the error is the
	// bad key's, so the outcome is error, not cancelled.
	ended, cancelEnded := context.WithCancel(t.Context())
	cancelEnded()
	if _, err := l.TryAcquire(ended, "", nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquire of an empty key with an ended context = %v", err)
	}
	if e := of[observe.AcquireEndEvent](r)[5]; e.Outcome != observe.AcquireError || !errors.Is(e.Err, dlock.ErrInvalidKey) {
		t.Errorf("AcquireEnd of a bad key with an ended context = %+v, want Outcome error", e)
	}

	// Closed: error.
	l.Close()
	if _, err := l.TryAcquire(t.Context(), "k", nil); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v", err)
	}
	if e := of[observe.AcquireEndEvent](r)[6]; e.Outcome != observe.AcquireError || !errors.Is(e.Err, dlock.ErrClosed) {
		t.Errorf("AcquireEnd after Close = %+v", e)
	}
}

// A loss the backend reports (memory.Store.Expire) ends the lease with
// EndBackend.
func TestObserverLossByBackend(t *testing.T) {
	s, l, r := observed(t, nil)
	le, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Expire("k") {
		t.Fatal("Expire found no lock")
	}
	e := waitFor[observe.LeaseEndEvent](t, r, 1)[0]
	if e.Reason != observe.EndBackend || !e.Reason.Lost() || !errors.Is(e.Err, dlock.ErrLeaseLost) || e.Token != le.Token() || e.Key != "k" {
		t.Errorf("LeaseEnd = %+v, want a loss reported by the backend", e)
	}
	if !errors.Is(le.Err(), dlock.ErrLeaseLost) {
		t.Errorf("Err = %v", le.Err())
	}
}

// A lease that nobody refreshes ends with EndExpired; Close ends the
// others with EndClosed.
func TestObserverExpiredAndClosed(t *testing.T) {
	_, l, r := observed(t, nil)
	short, err := l.TryAcquire(t.Context(), "short", &dlock.AcquireOptions{TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	<-short.Done()
	waitFor[observe.LeaseEndEvent](t, r, 1)
	if _, err := l.TryAcquire(t.Context(), "long", nil); err != nil {
		t.Fatal(err)
	}
	l.Close() // waits for the LeaseEnd calls
	ends := of[observe.LeaseEndEvent](r)
	if len(ends) != 2 {
		t.Fatalf("LeaseEnd events = %+v, want 2", ends)
	}
	if e := ends[0]; e.Key != "short" || e.Reason != observe.EndExpired || !e.Reason.Lost() {
		t.Errorf("first LeaseEnd = %+v, want short expired", e)
	}
	if e := ends[1]; e.Key != "long" || e.Reason != observe.EndClosed || e.Reason.Lost() || !errors.Is(e.Err, dlock.ErrClosed) {
		t.Errorf("second LeaseEnd = %+v, want long closed", e)
	}
}

// A failed Refresh is reported with its error; one that finds the lock
// gone ends the lease with EndNotHeld. The backend's name is the
// Guarantees.Backend of the driver (here the wrapped memory driver's).
func TestObserverRefresh(t *testing.T) {
	s := memory.NewStore()
	d := &flakyDriver{Driver: memory.NewDriver(s)} // no NotifyLoss: the store's Expire goes unnoticed
	r := &recorder{}
	l := mustNew(t, d, &dlock.Options{Observer: r})
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Refresh(t.Context(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	d.down.Store(true)
	if err := le.Refresh(t.Context(), 0); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Refresh while down = %v", err)
	}
	d.down.Store(false)
	s.Expire("k")
	if err := le.Refresh(t.Context(), 0); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of an expired lock = %v", err)
	}

	refs := of[observe.RefreshEvent](r)
	if len(refs) != 3 {
		t.Fatalf("Refresh events = %+v, want 3", refs)
	}
	if e := refs[0]; e.Backend != "memory" || e.Key != "k" || e.Token != le.Token() || e.Auto || e.TTL != 20*time.Second ||
		e.Granted != 20*time.Second || e.Err != nil || e.Duration <= 0 {
		t.Errorf("first Refresh = %+v", e)
	}
	if e := refs[1]; e.TTL != 10*time.Second || e.Granted != 0 || !errors.Is(e.Err, dlock.ErrUnavailable) {
		t.Errorf("Refresh while down = %+v", e)
	}
	if e := refs[2]; !errors.Is(e.Err, dlock.ErrNotHeld) {
		t.Errorf("Refresh of an expired lock = %+v", e)
	}
	e := waitFor[observe.LeaseEndEvent](t, r, 1)[0]
	if e.Reason != observe.EndNotHeld || !e.Reason.Lost() || e.Backend != "memory" {
		t.Errorf("LeaseEnd = %+v, want not_held", e)
	}
}

// Background refreshes are reported with Auto, failures included.
func TestObserverAutoRefresh(t *testing.T) {
	s := memory.NewStore()
	d := &flakyDriver{Driver: memory.NewDriver(s)}
	r := &recorder{}
	l := mustNew(t, d, &dlock.Options{Observer: r, Logger: slog.New(slog.DiscardHandler)})
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 300 * time.Millisecond, AutoRefresh: true, MaxHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if e := waitFor[observe.RefreshEvent](t, r, 1)[0]; !e.Auto || e.Err != nil || e.Granted != 300*time.Millisecond || e.Token != le.Token() {
		t.Errorf("first background Refresh = %+v", e)
	}
	d.down.Store(true)
	for {
		refs := waitFor[observe.RefreshEvent](t, r, len(of[observe.RefreshEvent](r))+1)
		if e := refs[len(refs)-1]; e.Err != nil {
			if !e.Auto || !errors.Is(e.Err, dlock.ErrUnavailable) || e.Granted != 0 {
				t.Errorf("failed background Refresh = %+v", e)
			}
			break
		}
	}
	// Still down: the lease runs out.
	if e := waitFor[observe.LeaseEndEvent](t, r, 1)[0]; e.Reason != observe.EndExpired {
		t.Errorf("LeaseEnd = %+v, want expired", e)
	}
}

// Hooks may call back into the Locker and the lease: they do not run under
// its locks.
func TestObserverHooksMayCallBack(t *testing.T) {
	s := memory.NewStore()
	r := &recorder{}
	l := mustMem(t, s, &dlock.Options{Observer: r})
	var (
		mu    sync.Mutex
		lease *dlock.Lease
	)
	done := make(chan struct{})
	r.onEvent = func(ctx context.Context, e any) {
		mu.Lock()
		le := lease
		mu.Unlock()
		switch e := e.(type) {
		case observe.AcquireEndEvent:
			if e.Key == "k" && le != nil {
				le.Err()
				le.Deadline()
			}
		case observe.RefreshEvent:
			// From the watchdog: release the lease being refreshed.
			if le == nil {
				return // not set yet: the next refresh
			}
			if err := le.Release(ctx); err != nil {
				t.Errorf("Release from the Refresh hook = %v", err)
			}
		case observe.LeaseEndEvent:
			if e.Token != 1 {
				return // the lease taken again below
			}
			// Take the key again from the LeaseEnd hook.
			again, err := l.TryAcquire(context.Background(), "k", nil)
			if err != nil {
				t.Errorf("TryAcquire from the LeaseEnd hook = %v", err)
				close(done)
				return
			}
			again.Release(context.Background())
			close(done)
		}
	}
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 60 * time.Millisecond, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lease = le
	mu.Unlock()
	select {
	case <-done:
		l.Close()
	case <-time.After(10 * time.Second):
		// Not closed: Close would wait for the deadlocked hook.
		t.Fatal("the hooks did not run to the end: deadlock?")
	}
}

// A nil Observer (the default) sees nothing and changes nothing: the same
// paths run without events.
func TestObserverNil(t *testing.T) {
	s := memory.NewStore()
	l := mustMem(t, s, &dlock.Options{Observer: nil})
	defer l.Close()
	le, err := l.TryAcquire(t.Context(), "k", &dlock.AcquireOptions{TTL: 60 * time.Millisecond, AutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Refresh(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	s.Expire("k")
	<-le.Done()
	if err := le.Release(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatal(err)
	}
	if n := driver.DriverOf(l).Guarantees().Backend; n != "memory" {
		t.Errorf("the memory driver's Guarantees().Backend = %q", n)
	}
}
