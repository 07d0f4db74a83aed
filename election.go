package dlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// ElectionOptions configure an [Election]. A nil *ElectionOptions means all
// defaults.
type ElectionOptions struct {
	// TTL is the leader's lease time. The leader's lease is refreshed
	// every TTL/3 for as long as it leads, without a MaxHold; when a
	// leader dies, the next leader is elected about one TTL later (on
	// ZooKeeper: when the leader's session expires). Default: the
	// Locker's TTL.
	TTL time.Duration
	// Holder identifies this candidate to the others: it is stored with
	// the leader's lease (see AcquireOptions.Holder) and returned by
	// Leader, OnLeader and `dlock inspect`. Default "hostname/pid".
	Holder string
	// OnLeader, if set, is called with the leader each time the leader
	// observed on the key changes: another candidate (or this one) is
	// elected, or the key falls free (Held false). It is called from
	// one goroutine of Run, one call at a time, first with the leader
	// seen when Run starts; it must not block for long (the Locker's
	// Close waits for a call in progress). On a backend
	// that reports changes (etcd, ZooKeeper: backend.ChangeWatcher) it
	// follows the server's watch; on the others (Redis, Redlock,
	// memory) Run polls Inspect every Options.RetryMax of the Locker
	// (default 500 ms). A change shorter than that may go unseen, and
	// the leader reported may already be gone: use it to show who leads,
	// never to decide whether to act — only lead's lease says that.
	OnLeader func(LockInfo)
}

// Election elects one leader among the candidates that run it on the same key
// of one backend (in one process or many): a mutex held for as long as the
// leader is alive, whose fencing token is the leader's term.
//
// The shape follows client-go's leaderelection, with fewer parts: Run's
// lead function is called when this candidate becomes leader (client-go's
// OnStartedLeading), its context ends the moment leadership is lost or
// given up (OnStoppedLeading), and ElectionOptions.OnLeader reports who
// leads (OnNewLeader). One function and one optional callback cover the
// three events, and there is no channel a caller could forget to drain.
//
// Terms increase strictly from one leader to the next as far as the
// backend's Guarantees().Fencing promises (etcd, ZooKeeper and memory:
// always; Redis: unless its counter is lost; Redlock: best effort). Pass
// the term to the resources the leader writes (package fence), so that a
// leader that lost its lease without noticing — a process pause, a
// partition — cannot overwrite its successor's work.
type Election struct {
	l        *Locker
	key      string
	ao       AcquireOptions
	onLeader func(LockInfo)

	mu struct {
		sync.Mutex
		running bool
		term    *term // the current term while this candidate leads
	}
}

// term is one period of leadership.
type term struct {
	resign context.CancelCauseFunc // ends the leader's context
	done   chan struct{}           // closed when the lease is given back
}

// NewElection returns an election on key among the candidates that run an
// Election on the same key through Lockers of the same backend. key, the
// TTL and the holder are checked as Acquire checks them, before any I/O
// (errors matching ErrInvalidKey, ErrInvalidTTL or ErrInvalidConfig). The
// election uses l until Run returns; it does not close it.
func NewElection(l *Locker, key string, opts *ElectionOptions) (*Election, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil Locker", ErrInvalidConfig)
	}
	var o ElectionOptions
	if opts != nil {
		o = *opts
	}
	if o.Holder == "" {
		o.Holder = defaultHolder()
	}
	e := &Election{
		l:   l,
		key: key,
		// No MaxHold: a leader leads for as long as it lives.
		ao:       AcquireOptions{TTL: o.TTL, AutoRefresh: true, MaxHold: math.MaxInt64, Holder: o.Holder},
		onLeader: o.OnLeader,
	}
	if err := l.check(key, &e.ao); err != nil {
		return nil, opErr("election", key, err)
	}
	if e.onLeader != nil {
		if _, err := l.inspector(); err != nil {
			return nil, opErr("election", key, fmt.Errorf("%w (OnLeader needs it)", err))
		}
	}
	return e, nil
}

// defaultHolder is "hostname/pid", within MaxHolderLen.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || backend.ValidateHolder(host) != nil {
		host = "unknown-host"
	}
	pid := "/" + strconv.Itoa(os.Getpid())
	if len(host)+len(pid) > backend.MaxHolderLen {
		host = host[:backend.MaxHolderLen-len(pid)]
		for len(host) > 0 && backend.ValidateHolder(host) != nil { // a cut rune
			host = host[:len(host)-1]
		}
	}
	return host + pid
}

// Run campaigns for leadership until ctx ends. Each time this candidate is
// elected, Run calls lead with a context that is cancelled the moment the
// leadership ends, and with the leader's lease: its Token is the term.
// Leadership ends when
//   - the lease is lost (its deadline passed without a refresh, the server
//     dropped it, the session ended): context.Cause of lead's context then
//     matches ErrLeaseLost. It is cancelled at the lease's Deadline at the
//     latest, on this process's clock; a backend that learns of a loss
//     sooner (etcd, ZooKeeper) cancels it sooner;
//   - the Locker is closed: the cause matches ErrClosed, and the context is
//     cancelled before the lease is given back (Close does not wait for
//     lead to return);
//   - lead returns, or Resign is called: the cause is context.Canceled;
//     lead releases the lease itself: the cause matches ErrNotHeld; ctx
//     ends: the cause is ctx's.
//
// A term whose lease is lost before lead is called (a session that expired
// at the grant) is not led: lead is not called. lead must return promptly
// once its context is done. When it has
// returned, Run gives the lease back (never before, so two of a process's
// terms do not overlap; a panic in lead gives it back too, and goes on)
// and, unless ctx is done, campaigns again: at once after a loss (after a
// growing pause, up to the Locker's RetryMax, when terms keep being lost
// within a third of their TTL), or after a pause of 2 × RetryMax (default
// 1 s) when this candidate gave leadership up, so that another candidate
// can take over. An error from lead is logged with the Locker's Logger and
// otherwise treated as giving up leadership.
//
// Run returns context.Cause(ctx) when ctx ends, an error matching ErrClosed
// when the Locker is closed, or an error matching ErrInvalidConfig when
// lead is nil or Run is already running on e. A backend that cannot be
// reached does not end Run: it logs the failure and campaigns again, with
// a growing pause up to RetryMax between attempts.
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context, lease *Lease) error) error {
	if lead == nil {
		return opErr("election", e.key, fmt.Errorf("%w: nil lead function", ErrInvalidConfig))
	}
	e.mu.Lock()
	if e.mu.running {
		e.mu.Unlock()
		return opErr("election", e.key, fmt.Errorf("%w: Run is already running on this Election", ErrInvalidConfig))
	}
	e.mu.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.mu.running = false
		e.mu.Unlock()
	}()

	if e.onLeader != nil {
		octx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { e.observe(octx) })
		defer wg.Wait()
		defer cancel()
	}
	// pause waits d, or until ctx ends or the Locker is closed; it
	// reports whether Run goes on.
	pause := func(d time.Duration) bool {
		return sleep(ctx, d, e.l.closing.Done()) == nil && e.l.closing.Err() == nil
	}
	failures, losses := 0, 0
	for {
		le, err := e.l.Acquire(ctx, e.key, &e.ao)
		switch {
		case ctx.Err() != nil:
			if le != nil {
				e.giveBack(ctx, le)
			}
			return context.Cause(ctx)
		case errors.Is(err, ErrClosed):
			return err
		case err != nil:
			// The backend failed (Acquire retried already): wait and
			// campaign again.
			failures++
			e.l.log.Warn("dlock: election: campaign failed; trying again", "key", e.key, "err", err)
			if !pause(e.l.backoff(failureBackoff, failures-1)) {
				return e.stopped(ctx)
			}
			continue
		}
		failures = 0
		granted := time.Now()
		gaveUp := e.lead(ctx, le, lead)
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case e.l.closing.Err() != nil:
			return opErr("election", e.key, ErrClosed)
		case gaveUp:
			losses = 0
			if !pause(2 * e.l.opts.RetryMax) {
				return e.stopped(ctx)
			}
		case time.Since(granted) < e.ao.TTL/3:
			// Lost as soon as granted (a session that is gone, a
			// key deleted by another client): do not spin.
			losses++
			e.l.log.Warn("dlock: election: leadership lost right after the grant; campaigning again", "key", e.key, "term", le.Token(), "err", le.Err())
			if !pause(e.l.backoff(failureBackoff, losses-1)) {
				return e.stopped(ctx)
			}
		default:
			losses = 0
		}
	}
}

// stopped is Run's result when a pause was cut short: ctx's cause, or
// ErrClosed.
func (e *Election) stopped(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return opErr("election", e.key, ErrClosed)
}

// lead runs one term: lead under a context that ends with the lease, then
// the lease given back. gaveUp reports that the lease was still held when
// the term ended (lead returned, or Resign).
func (e *Election) lead(ctx context.Context, le *Lease, lead func(context.Context, *Lease) error) (gaveUp bool) {
	lctx, cancelLease := le.Context(ctx)
	lctx, resign := context.WithCancelCause(lctx)
	t := &term{resign: resign, done: make(chan struct{})}
	e.mu.Lock()
	e.mu.term = t
	e.mu.Unlock()
	// Deferred, so that a panicking lead gives the lease back too (the
	// watchdog would keep it forever: there is no MaxHold).
	defer func() {
		resign(context.Canceled)
		cancelLease()
		// Still held, or released by lead itself: given up, not lost.
		err := le.Err()
		gaveUp = err == nil || errors.Is(err, errReleased)
		e.giveBack(ctx, le)
		e.mu.Lock()
		e.mu.term = nil
		e.mu.Unlock()
		close(t.done)
	}()
	if lctx.Err() != nil {
		// Lost before it began (a session that expired at the grant): no
		// lead for a term that is over.
		return gaveUp
	}
	if err := lead(lctx, le); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrClosed) {
		e.l.log.Warn("dlock: election: the leader's function failed; leadership given up", "key", e.key, "term", le.Token(), "err", err)
	}
	return gaveUp
}

// giveBack releases le, even when ctx has ended (bounded).
func (e *Election) giveBack(ctx context.Context, le *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeReleaseTimeout)
	defer cancel()
	if err := le.Release(rctx); err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrClosed) {
		e.l.log.Warn("dlock: election: giving leadership back failed; it ends with its TTL", "key", e.key, "term", le.Token(), "err", err)
	}
}

// Resign gives leadership up if this candidate leads: it cancels the
// leader's context, waits for lead to return and for the lease to be given
// back, and returns nil; Run then campaigns again after a pause (see Run).
// When this candidate does not lead, it returns nil at once; a term that
// begins while Resign runs (a grant that was on its way) is not ended by
// it. When ctx ends first it returns ctx.Err(); the lease is still given
// back once lead returns. lead itself must not call Resign (it would wait
// for itself): to step down from within lead, return.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	t := e.mu.term
	e.mu.Unlock()
	if t == nil {
		return nil
	}
	t.resign(context.Canceled)
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Leader reads who leads now: Held false when nobody does; otherwise the
// leader's term (Token), the holder description it campaigned with
// (Holder), and what else the backend can tell, as Locker.Inspect. It is a
// snapshot, for display: only a leader's own lease says that it leads.
func (e *Election) Leader(ctx context.Context) (LockInfo, error) {
	return e.l.Inspect(ctx, e.key)
}

// observe calls onLeader each time the leader changes, until ctx ends or
// the Locker is closed: following the backend's change watch where it has
// one, else polling every RetryMax. It holds the Locker open (inflight)
// while it runs, so its watch ends before the backend is closed.
func (e *Election) observe(ctx context.Context) {
	l := e.l
	if l.enter() != nil {
		return
	}
	defer l.inflight.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()

	cw, _ := l.drv.(backend.ChangeWatcher)
	var (
		last    LockInfo
		first   = true
		failing bool // the last Inspect failed (logged once)
		changed <-chan struct{}
		stop    = func() {}
	)
	defer func() { stop() }()
	for ctx.Err() == nil {
		if cw != nil && changed == nil {
			ch, st, err := cw.WatchChanges(ctx, e.key)
			switch {
			case err == nil:
				changed, stop = ch, st
			case ctx.Err() == nil:
				l.log.Warn("dlock: election: cannot watch the leader; polling", "key", e.key, "err", err)
			}
		}
		info, err := e.Leader(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			l.log.Warn("dlock: election: cannot read the leader; trying again", "key", e.key, "err", err)
		case err == nil:
			failing = false
			if first || info.Held != last.Held || info.Token != last.Token || info.Holder != last.Holder {
				first, last = false, info
				e.onLeader(info)
			}
		}
		if changed == nil || err != nil {
			if sleep(ctx, l.opts.RetryMax, nil) != nil {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changed:
			if !ok {
				// The watch ended by itself: watch anew and read
				// again, after a pause (a watch that keeps ending at
				// once must not spin).
				stop()
				changed, stop = nil, func() {}
				if sleep(ctx, jitter(l.opts.RetryMax), nil) != nil {
					return
				}
			}
		}
	}
}
