package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/observe"
)

// Lease is a held lock. Its methods are safe for concurrent use.
//
// A lease ends in one of three ways: Release; loss (its deadline passed
// without a successful refresh, a refresh found the lock gone, or the
// backend reported it lost); or Close of its Locker, which releases it.
// Then Done is closed and Err says which.
type Lease struct {
	l        *Locker
	key      string
	token    Token
	bl       backend.Lease
	askedTTL time.Duration
	wd       *wdEntry  // in the Locker's watchdog; nil without AutoRefresh
	obs      *leaseObs // for the Locker's observe.Observer; nil without one

	opMu     sync.Mutex // serializes Refresh and Release calls to bl
	returned bool       // bl.Release succeeded or found the lock gone; under opMu

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	dl       atomic.Int64  // deadline as nanoseconds since l.epoch, for the Locker's sweep
	err      error         // set once, when the lease ends
	done     chan struct{} // made by the first Done; closedChan if the lease ended first
	timer    *time.Timer   // closes done at the deadline; made with done
	// onEnd cancels the contexts made by Context when the lease ends.
	onEnd map[*context.CancelCauseFunc]struct{}

	prev, next *Lease // in the Locker's list of held leases, under l.mu
}

// closedChan is the Done channel of a lease that ended before anyone asked.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (l *Locker) newLease(key string, bl backend.Lease, start time.Time, ao *AcquireOptions) (*Lease, error) {
	le := &Lease{
		l:        l,
		key:      key,
		token:    Token(bl.Token()),
		bl:       bl,
		askedTTL: ao.TTL,
		ttl:      bl.TTL(),
	}
	if l.opts.Observer != nil {
		le.obs = &leaseObs{start: start}
	}
	le.setDeadline(start.Add(le.ttl - l.margin(le.ttl)))
	// A loss the backend reports ends the lease, also while a Release or
	// Close is under way. It is asked for before the lease is linked or
	// given to the watchdog (the backend contract: before any Refresh or
	// Release); a loss known already ends the lease at once, and it is
	// then neither linked nor refreshed.
	if notifier, ok := bl.(backend.LossNotifier); ok {
		notifier.NotifyLoss(le.lostByBackend)
	}

	// le.mu is held until the lease is set up: the watchdog can end it
	// only then.
	le.mu.Lock()
	l.mu.Lock()
	closed := l.closed
	var expired *Lease
	if !closed && le.err == nil {
		expired = l.link(le)
		if ao.AutoRefresh {
			// Copied, so that ao does not escape to the heap.
			ttl, maxUntil := ao.TTL, start.Add(ao.MaxHold)
			// The least TTL the backend grants: its MinGrant, or more
			// if it granted more than asked (beyond rounding) now, as
			// it would raise a shorter refresh too.
			floor := l.limits.MinGrant
			if le.ttl > roundUp(ttl, l.limits.Resolution) {
				floor = max(floor, le.ttl)
			}
			le.wd = &wdEntry{le: le, ttl: ttl, floor: floor, maxUntil: maxUntil, interval: ttl / 3, idx: -1}
			l.wd.add(le.wd, le.deadline)
		}
	}
	l.mu.Unlock()
	le.mu.Unlock()
	if expired != nil {
		expired.checkDeadline()
	}
	if closed {
		// Close began while we were acquiring: give the lock back.
		ctx, cancel := context.WithTimeout(context.Background(), closeReleaseTimeout)
		defer cancel()
		_ = le.release(ctx, ErrClosed)
		le.end(ErrClosed, observe.EndClosed)
		return nil, ErrClosed
	}
	return le, nil
}

// Key returns the lock key.
func (le *Lease) Key() string { return le.key }

// Token returns the fencing token of this grant (0 if the backend issues
// none). Pass it to the protected resource with every write, and have the
// resource reject tokens lower than the highest it has seen.
func (le *Lease) Token() Token { return le.token }

// TTL returns the lease time the server granted at the last acquire or
// refresh. It may differ from what was asked where the backend says so
// (etcd raises short TTLs; Redis truncates to whole milliseconds).
func (le *Lease) TTL() time.Duration {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.ttl
}

// Deadline returns a conservative local bound on the lease's end, on this
// process's monotonic clock: the moment the last grant or refresh was
// requested, plus the granted TTL, minus a margin for clock drift. The
// server will not expire the lease before it, as long as clocks drift less
// than the margin allows. Done is closed at Deadline at the latest, unless
// the lease was refreshed.
func (le *Lease) Deadline() time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.deadline
}

// Done returns a channel that is closed when the lease ends: released, lost,
// or its Locker closed. A Done called at or after Deadline returns a closed
// channel. Done can fire late (a paused process learns late); only a
// resource that checks the fencing token is safe from a holder that no
// longer holds the lock.
func (le *Lease) Done() <-chan struct{} {
	le.mu.Lock()
	defer le.mu.Unlock()
	// Past the deadline the lease ends here, not on the timer's goroutine
	// a moment later: a look at a channel made now must find it closed.
	le.checkDeadlineLocked()
	if le.done == nil {
		// Made on demand: most leases are released without a look.
		le.done = make(chan struct{})
		le.timer = time.AfterFunc(time.Until(le.deadline), le.checkDeadline)
	}
	return le.done
}

// Err returns nil while the lease is held; after Done is closed, an error
// that matches ErrLeaseLost if the lease was lost, ErrNotHeld if it was
// released, or ErrClosed if its Locker was closed.
func (le *Lease) Err() error {
	le.checkDeadline()
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.err
}

// Context returns a context derived from parent that is cancelled when the
// lease ends; context.Cause then returns Err. The Locker's Close cancels it
// (cause ErrClosed) before it gives the lock back, so that work under it
// stops before another holder can take the lock; Release does not, so the
// context may be the one passed to Release. Call cancel when done with it.
//
// It starts no goroutine: the lease's end cancels the context directly.
func (le *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	le.Done() // arms the deadline timer, or ends the lease if past its deadline
	le.mu.Lock()
	if le.err != nil {
		err := le.err
		le.mu.Unlock()
		cancel(err)
		return ctx, func() { cancel(context.Canceled) }
	}
	if le.onEnd == nil {
		le.onEnd = map[*context.CancelCauseFunc]struct{}{}
	}
	le.onEnd[&cancel] = struct{}{}
	le.mu.Unlock()
	// Forget the context when it ends first (parent cancelled, or the
	// caller's cancel): no goroutine until then.
	context.AfterFunc(ctx, func() {
		le.mu.Lock()
		delete(le.onEnd, &cancel)
		le.mu.Unlock()
	})
	return ctx, func() { cancel(context.Canceled) }
}

// Refresh extends the lease to ttl from now (ttl 0: the TTL the lease was
// acquired with); the new Deadline counts from when the request was sent.
// If the lease is no longer held the error matches ErrNotHeld, the lease
// ends as lost, and nothing is changed on the server. A refresh whose reply
// comes after Deadline is too late: the lease ended then, the error matches
// ErrNotHeld, and what the server extended is given back (released).
// Other errors (the backend unreachable) leave the outcome unknown: the
// lease stays valid until Deadline, which moves earlier if ttl would have
// ended the lease sooner.
func (le *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = le.askedTTL
	}
	if le.l.opts.Observer == nil {
		if err := le.l.checkTTL(ttl); err != nil {
			return opErr("refresh", le.key, err)
		}
		return le.refresh(ctx, ttl)
	}
	start := time.Now()
	err := le.l.checkTTL(ttl)
	if err != nil {
		err = opErr("refresh", le.key, err)
	} else {
		err = le.refresh(ctx, ttl)
	}
	var granted time.Duration
	if err == nil {
		granted = le.TTL()
	}
	le.observeRefresh(ctx, false, start, ttl, granted, err)
	return err
}

func (le *Lease) refresh(ctx context.Context, ttl time.Duration) error {
	le.opMu.Lock()
	defer le.opMu.Unlock()
	if err := le.Err(); err != nil {
		return opErr("refresh", le.key, notHeld(err))
	}
	start := time.Now()
	le.shortenFor(start, ttl)
	granted, err := le.bl.Refresh(ctx, ttl)
	err = le.settle(ctx, start, ttl, granted, err)
	if le.wd != nil {
		// The watchdog's next refresh was planned for the old Deadline;
		// one that is now sooner (a shorter TTL, granted or pulled in
		// by a refresh whose outcome is unknown) brings it forward.
		le.l.wd.reschedule(le.wd, le.Deadline())
	}
	return err
}

// shortenFor pulls the Deadline in to what a refresh to ttl sent at start
// leaves, if that is sooner: the server may apply a shorter TTL as soon as
// the request reaches it, before its reply (if any) comes back, and the
// Deadline must never be later than the server's expiry meanwhile.
func (le *Lease) shortenFor(start time.Time, ttl time.Duration) {
	le.mu.Lock()
	defer le.mu.Unlock()
	if d := start.Add(ttl - le.l.margin(ttl)); d.Before(le.deadline) && le.err == nil {
		le.setDeadline(d)
	}
}

// settle applies the outcome of a refresh to ttl requested at start: the
// TTL granted, or err. le.opMu is held.
func (le *Lease) settle(ctx context.Context, start time.Time, ttl, granted time.Duration, err error) error {
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			le.end(fmt.Errorf("%w: refresh found the lock no longer ours", ErrLeaseLost), observe.EndNotHeld)
			return opErr("refresh", le.key, err)
		}
		// The outcome is unknown: the server may have set the new TTL.
		// If that is shorter than what is left, the deadline must follow
		// (the callers pulled it in before sending; a caller that did not
		// is covered here).
		le.shortenFor(start, ttl)
		return opErr("refresh", le.key, err)
	}
	le.mu.Lock()
	// A reply that comes after the deadline comes too late, whether or
	// not anyone looked at Done meanwhile: the lease ended then.
	le.checkDeadlineLocked()
	lost := le.err != nil
	if !lost {
		le.ttl = granted
		le.setDeadline(start.Add(granted - le.l.margin(granted)))
	}
	le.mu.Unlock()
	if lost {
		// The lease ended while the refresh was in flight (its deadline
		// passed, or the backend reported it lost): give back what the
		// server just extended.
		le.giveBack(ctx)
		return opErr("refresh", le.key, notHeld(le.Err()))
	}
	return nil
}

// Release gives the lock up. Releasing a lease that is no longer held
// (released before, lost, or released by Close) returns an error matching
// ErrNotHeld and touches no other holder's lock. If the backend cannot be
// reached the error matches ErrUnavailable: the lock may or may not be free,
// so the lease ends (as lost). Calling Release again tries once more to
// give the lock back (and returns ErrNotHeld); otherwise the lock ends with
// its TTL.
func (le *Lease) Release(ctx context.Context) error {
	var start time.Time
	if le.l.opts.Observer != nil {
		start = time.Now()
	}
	err := le.release(ctx, errReleased)
	if err != nil {
		err = opErr("release", le.key, err)
	}
	if le.l.opts.Observer != nil {
		le.observeRelease(ctx, start, err)
	}
	return err
}

// giveBack releases the lock of a lease that has ended already, if it may
// still be ours on the server; ctx's cancellation is ignored (the lease's
// own background context is cancelled by then), a short timeout is not.
// le.opMu is held.
func (le *Lease) giveBack(ctx context.Context) {
	if le.returned {
		return
	}
	// An ended lease is not in the Locker's list, so Close does not wait
	// for it: register as an operation in flight, or skip if closed.
	if le.l.enter() != nil {
		return
	}
	defer le.l.inflight.Done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeReleaseTimeout)
	defer cancel()
	if err := le.bl.Release(ctx); err == nil || errors.Is(err, ErrNotHeld) {
		le.returned = true
	}
}

// errReleased is the Err of a released lease.
var errReleased = fmt.Errorf("%w: released", ErrNotHeld)

// release gives the lock back and ends the lease with reason. It first takes
// the lease out of the watchdog: a batch of background refreshes in flight
// with it is waited for only up to the batch's patience, then cancelled (a
// backend may not answer until the lease's deadline), since the lease ends
// here whatever the outcome.
func (le *Lease) release(ctx context.Context, reason error) error {
	le.stopWatchdog(true)
	le.opMu.Lock()
	defer le.opMu.Unlock()
	if err := le.Err(); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			// Lost by our own deadline: the key may still be ours on
			// the server for the drift margin. Free it for others.
			le.giveBack(ctx)
		}
		return notHeld(err)
	}
	err := le.bl.Release(ctx)
	switch {
	case err == nil:
		le.returned = true
		if reason == ErrClosed {
			le.end(reason, observe.EndClosed)
		} else {
			le.end(reason, observe.EndReleased)
		}
		return nil
	case errors.Is(err, ErrNotHeld):
		le.returned = true
		le.end(fmt.Errorf("%w: release found the lock no longer ours", ErrLeaseLost), observe.EndNotHeld)
		return err
	default:
		// The outcome is unknown: the lock may be free already, so the
		// lease can no longer be trusted. A later Release tries again
		// to give the lock back.
		if reason == ErrClosed {
			le.end(fmt.Errorf("%w: the release at close failed, the lock may be free: %w", ErrClosed, err), observe.EndClosed)
		} else {
			le.end(fmt.Errorf("%w: release failed, the lock may be free: %w", ErrLeaseLost, err), observe.EndReleaseFailed)
		}
		return err
	}
}

// endContexts cancels the contexts made by Context with cause reason, ahead
// of the lease's end (which cancels those made later): Close calls it
// before it gives the lock back.
func (le *Lease) endContexts(reason error) {
	le.mu.Lock()
	defer le.mu.Unlock()
	for cancel := range le.onEnd {
		(*cancel)(reason)
	}
	le.onEnd = nil
}

// notHeld turns the reason a lease ended into the error of a later Release or
// Refresh: it matches ErrNotHeld and the reason.
func notHeld(reason error) error {
	if errors.Is(reason, ErrNotHeld) {
		return reason
	}
	return fmt.Errorf("%w: %w", ErrNotHeld, reason)
}

// end ends the lease once, with err as its Err; why classifies it for the
// Observer.
func (le *Lease) end(err error, why observe.EndReason) {
	le.mu.Lock()
	defer le.mu.Unlock()
	le.endLocked(err, why)
}

// lostByBackend is the backend's loss callback (backend.LossNotifier).
func (le *Lease) lostByBackend(err error) { le.end(err, observe.EndBackend) }

// endLocked is end with le.mu held.
func (le *Lease) endLocked(err error, why observe.EndReason) {
	if le.err != nil {
		return
	}
	le.err = err
	if o := le.obs; o != nil {
		o.why = why
		if o.observed {
			le.observeEnd() // on a goroutine of its own
		}
	}
	for cancel := range le.onEnd {
		(*cancel)(err)
	}
	le.onEnd = nil
	if le.done == nil {
		le.done = closedChan
	} else {
		le.timer.Stop()
		close(le.done)
	}
	le.stopWatchdog(false)
	le.l.mu.Lock()
	le.l.unlink(le)
	le.l.mu.Unlock()
}

// setDeadline moves the deadline (and the timer, if there is one). le.mu is
// held, or le is not shared yet.
func (le *Lease) setDeadline(d time.Time) {
	le.deadline = d
	le.dl.Store(int64(d.Sub(le.l.epoch)))
	if le.timer != nil {
		le.timer.Reset(time.Until(d))
	}
}

// checkDeadline ends the lease as lost if its deadline has passed. It runs
// when the deadline timer fires, from Done, Err and Context, and from the
// Locker's sweep. The check and the end are one step under le.mu, so a
// refresh that moves the deadline cannot slip in between.
func (le *Lease) checkDeadline() {
	le.mu.Lock()
	defer le.mu.Unlock()
	le.checkDeadlineLocked()
}

// checkDeadlineLocked is checkDeadline with le.mu held.
func (le *Lease) checkDeadlineLocked() {
	if le.err == nil && !time.Now().Before(le.deadline) {
		le.endLocked(fmt.Errorf("%w: deadline passed without a refresh", ErrLeaseLost), observe.EndExpired)
	}
}

// stopWatchdog takes the lease out of the Locker's watchdog, if it is in it;
// release: a Release or Close is about to wait for the lease (see
// watchdog.stop).
func (le *Lease) stopWatchdog(release bool) {
	if le.wd != nil {
		le.l.wd.stop(le.wd, release)
	}
}
