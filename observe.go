package dlock

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock/observe"
)

// backendName is the name of l's backend for events: its
// Guarantees.Backend, or "unknown".
func (l *Locker) backendName() string { return l.name }

// observedAcquire is acquire reported to the Observer o.
func (l *Locker) observedAcquire(ctx context.Context, o observe.Observer, op, key string, opts *AcquireOptions, wait bool) (*Lease, error) {
	name := l.backendName()
	start := time.Now()
	ctx = o.AcquireStart(ctx, observe.AcquireStartEvent{Backend: name, Key: key, Try: !wait})
	attempts := 0
	le, err := l.acquire(ctx, op, key, opts, wait, &attempts)
	e := observe.AcquireEndEvent{Backend: name, Key: key, Try: !wait, Err: err, Wait: time.Since(start), Attempts: attempts}
	switch {
	case err == nil:
		e.Outcome, e.Token, e.TTL = observe.AcquireAcquired, le.token, le.TTL()
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// The end of the caller's context ended the acquire (not bad
		// input found before, with a context that had ended already).
		e.Outcome = observe.AcquireCancelled
	case errors.Is(err, ErrNotAcquired):
		e.Outcome = observe.AcquireNotAcquired
	default:
		e.Outcome = observe.AcquireError
	}
	o.AcquireEnd(ctx, e)
	if le != nil {
		// From now on its end is reported; if it has ended already
		// (lost at once), report that now.
		le.mu.Lock()
		le.obs.observed = true
		ended := le.err != nil
		le.mu.Unlock()
		if ended {
			o.LeaseEnd(le.endEvent())
		}
	}
	return le, err
}

// endEvent describes the end of le, which has ended.
func (le *Lease) endEvent() observe.LeaseEndEvent {
	return observe.LeaseEndEvent{
		Backend: le.l.backendName(), Key: le.key, Token: le.token,
		Reason: le.obs.why, Err: le.err, Held: time.Since(le.obs.start),
	}
}

// leaseObs is what a Lease keeps for its Locker's Observer.
type leaseObs struct {
	start    time.Time         // when the grant was requested
	why      observe.EndReason // why the lease ended; set with Lease.err, under Lease.mu
	observed bool              // AcquireEnd reported the lease: report its end; under Lease.mu
}

// observeEnd reports the end of le, whose acquire was reported, on a
// goroutine of its own: the lease ends under its own locks, sometimes on a
// backend's event goroutine. Close waits for it. le.mu is held.
func (le *Lease) observeEnd() {
	o, e := le.l.opts.Observer, le.endEvent()
	le.l.observers.Add(1)
	go func() {
		defer le.l.observers.Done()
		o.LeaseEnd(e)
	}()
}

// observeRefresh reports a refresh of le that started at start.
func (le *Lease) observeRefresh(ctx context.Context, auto bool, start time.Time, ttl, granted time.Duration, err error) {
	le.l.opts.Observer.Refresh(ctx, observe.RefreshEvent{
		Backend: le.l.backendName(), Key: le.key, Token: le.token, Auto: auto,
		TTL: ttl, Granted: granted, Duration: time.Since(start), Err: err,
	})
}

// observeRelease reports a call of Release that started at start.
func (le *Lease) observeRelease(ctx context.Context, start time.Time, err error) {
	e := observe.ReleaseEvent{Backend: le.l.backendName(), Key: le.key, Token: le.token, Err: err, Duration: time.Since(start)}
	switch {
	case err == nil:
		e.Outcome = observe.ReleaseReleased
	case errors.Is(err, ErrNotHeld):
		e.Outcome = observe.ReleaseNotHeld
	default:
		e.Outcome = observe.ReleaseError
	}
	le.l.opts.Observer.Release(ctx, e)
}
