// Package dlock gives every distributed-lock backend one shape: acquire a
// lease on a key, get a fencing token with it, learn promptly when the lease
// is lost, and release it.
//
//	locker, err := dlock.Open(ctx, "redis://localhost:6379?ttl=10s") // or etcd://, zk://, mem://
//	lease, err := locker.Acquire(ctx, "orders/42", nil)
//	defer lease.Release(ctx)
//	ctx, cancel := lease.Context(ctx) // cancelled if the lease is lost
//	defer cancel()
//	err = store.Write(ctx, data, lease.Token()) // the resource rejects stale tokens
//
// A *Locker wraps one backend (see package backend for the driver interface
// and the backend packages redis, memory, ...). The Locker owns what must
// behave the same everywhere: key and TTL validation before any I/O, the
// one retry/wait loop, automatic refresh with a bound on total hold time,
// the lease-lost signal, the closed state, and errors that name the
// operation and key.
//
// Configuration takes one path, in the manner of gocloud.dev: [Open] takes
// a URL whose scheme picks the backend, among those whose packages the
// program imports (redis, etcd, zookeeper, redlock, memory); [Config] names
// one URL per [Purpose]. A program that already has a client passes it to
// the backend's own constructor (redis.New, etcd.New, ...).
//
// An [Election] elects one leader among the processes that run it on a key,
// on any backend: the leader's lease is a held lock, and its token is the
// leader's term.
//
// Backend constructors check Options before any I/O and return an error
// matching ErrInvalidConfig or ErrInvalidTTL for a bad one. [Options].Logger
// is the one logger: the Locker and its backend log there. Backend authors
// find the driver interface in package backend and the plumbing that turns
// a driver into a Locker (and registers a URL scheme) in package driver.
//
// A lock is only as safe as the backend's [Guarantees] say. A lease can be
// lost without the holder noticing in time (a process pause, a clock jump,
// a slow network): Done may fire late. Only a resource that checks the
// fencing token ([Lease.Token]) is safe against a holder that no longer
// holds the lock.
package dlock

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/observe"
)

// Token is a fencing token: it increases strictly per key from one holder to
// the next (as far as the backend's [Guarantees].Fencing promises). 0 means
// the backend issues none. Pass it to the protected resource with every
// write, and have the resource reject tokens lower than the highest it has
// seen: that, not the lock alone, makes the resource safe from a holder
// that no longer holds the lock. The same type is in [LockInfo].Token.
type Token = backend.Token

// Guarantees is what a backend promises; see [backend.Guarantees].
type Guarantees = backend.Guarantees

// Limits are a backend's bounds on lease times; see [Locker.Limits].
type Limits = backend.Limits

// FencingGrade says how far tokens can be trusted; see [backend.FencingGrade].
type FencingGrade = backend.FencingGrade

// The fencing grades.
const (
	FencingNone       = backend.FencingNone
	FencingBestEffort = backend.FencingBestEffort
	FencingConsensus  = backend.FencingConsensus
)

// MaxKeyLen is the longest key, in bytes, that dlock accepts.
const MaxKeyLen = backend.MaxKeyLen

// minTTL is the shortest lease dlock grants on any backend (10 ms, see
// Limits.MinTTL): below it the safety margin of Lease.Deadline would eat
// the whole lease. Backends may have a higher floor.
const minTTL = backend.MinTTL

// failedAttempts is how many attempts in a row must fail with
// ErrUnavailable before Acquire gives up on the backend (see Acquire).
// After a failure Acquire backs off for 25–50ms, then 50–100ms (or longer
// with a larger Options.RetryMin), so a persistent failure ends it within
// about 150ms plus the attempts' own time.
const failedAttempts = 3

// Defaults used where Options or AcquireOptions leave a field zero (the
// fields' documentation gives their values).
const (
	defaultTTL         = backend.DefaultTTL
	defaultRetryMin    = 5 * time.Millisecond
	defaultRetryMax    = 500 * time.Millisecond
	defaultDriftFactor = 0.01
	// defaultMaxHoldFactor: with AutoRefresh and no MaxHold, the total
	// hold time is bounded by this many TTLs.
	defaultMaxHoldFactor = 10
)

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// TTL is the lease time for acquires that do not set one.
	// Default 30 s, or the backend's Limits().MaxTTL if that
	// is shorter (ZooKeeper's: two thirds of the session timeout less a
	// server tick, 24.67 s on the default 40 s session).
	TTL time.Duration
	// RetryMin and RetryMax bound the jittered, exponentially growing delay
	// between attempts of Acquire on a backend that cannot tell waiters
	// when a key is freed. The delay never exceeds the holder's remaining
	// lease when the backend reports it. On a backend that wakes waiters,
	// RetryMax is the fallback poll interval. Defaults 5 ms (RetryMin)
	// and 500 ms (RetryMax, or RetryMin if that is larger).
	RetryMin, RetryMax time.Duration
	// DriftFactor is the share of a TTL assumed lost to clock drift between
	// this process and the servers: Lease.Deadline is the time the grant was
	// requested plus TTL minus TTL×DriftFactor minus 2 ms. It must be below
	// 0.5. Default 0.01; a backend whose algorithm assumes more (Redlock's
	// drift_factor, reported in its Limits.DriftFactor) raises it to its
	// own.
	DriftFactor float64
	// Logger receives the Locker's warnings (failed background refreshes,
	// failed releases at Close) and its backend's (each backend package
	// says what it logs): the backend constructors and URL openers hand
	// it to the backend. A normal Close logs nothing above Debug. Default
	// slog.Default().
	Logger *slog.Logger
	// Observer receives the events of acquires and leases, for metrics
	// and traces (see package observe; package
	// github.com/dlock-go/dlock/otel adapts it to OpenTelemetry). Default
	// nil: no events.
	Observer observe.Observer
}

// AcquireOptions configure one acquire. A nil *AcquireOptions means all
// defaults.
type AcquireOptions struct {
	// TTL is the lease time asked of the server. Default: the Locker's TTL.
	TTL time.Duration
	// AutoRefresh has the Locker's watchdog refresh the lease every TTL/3
	// until it is released, lost, or MaxHold is reached. Default false.
	// The watchdog is one goroutine per Locker, however many leases it
	// keeps: leases that come due within a tenth of their refresh
	// interval of each other are refreshed together, in one round trip
	// where the backend can batch (backend.BatchRefresher).
	AutoRefresh bool
	// MaxHold bounds the total time an auto-refreshed lease is held,
	// counted from the acquire: the watchdog never extends the lease past
	// it (it asks for a shorter last TTL, allowing for a backend that
	// rounds TTLs up, see Limits.Resolution), so a stuck holder cannot keep
	// the lock forever; the lease then expires and Done fires. It must be
	// at least the TTL as the backend grants it. Default 10 × TTL. Without AutoRefresh it bounds nothing,
	// but it is checked all the same: a negative MaxHold is refused
	// (ErrInvalidConfig) with or without AutoRefresh.
	MaxHold time.Duration
	// Holder describes who holds the lock, for people and tools, e.g.
	// "web-3/4242" (hostname/pid): every backend of this repository
	// stores it with the lock, and Inspect returns it (LockInfo.Holder)
	// while the lease is held. It is not an identity check: nothing is
	// refused for a holder's name. At most 256 bytes of printable UTF-8
	// (unicode.IsPrint: no control, format or separator characters other
	// than the ASCII space), or the acquire fails with ErrInvalidConfig
	// before any I/O. Default "" (none).
	Holder string
	// Permits makes the acquire take one permit of a counting semaphore
	// of Permits permits on the key: at most Permits leases on the key
	// are valid at once. Every holder of one semaphore must ask for the
	// same Permits; an acquire that asks for another number while the
	// key is held fails at once with an error matching ErrInvalidConfig
	// (a *PermitsError says both numbers). A plain acquire (Permits 0,
	// Shared false) on a semaphore's key is exclusive: it waits for every
	// permit. Default 0: no semaphore. Negative: ErrInvalidConfig.
	Permits int
	// Shared makes the acquire take a reader's lease of a read-write lock
	// on the key: any number of readers hold it together, while a plain
	// acquire of the key (the writer) excludes them all. A reader waits
	// while a writer waits (writers are not starved). Permits > 0 implies
	// a shared lease too, bounded by Permits. Default false.
	//
	// Shared leases (Shared or Permits) are served by the backends whose
	// Guarantees().Shared is true; on others (Redlock) the acquire fails
	// with ErrUnsupported before any I/O. Their tokens increase across
	// all grants on the key, shared and exclusive alike.
	Shared bool
}

// Locker takes leases on keys from one backend. It is safe for concurrent use.
// Several Lockers on the same servers (in one process or many) exclude each
// other per key.
type Locker struct {
	drv    backend.Driver
	limits backend.Limits
	name   string // the backend's name (Guarantees.Backend), for events
	opts   Options
	log    *slog.Logger

	closing   context.Context // cancelled by Close
	close     context.CancelFunc
	closeDone chan struct{}  // closed when Close has finished
	bg        sync.WaitGroup // the watchdog and its batches
	observers sync.WaitGroup // Observer.LeaseEnd calls in progress
	wd        watchdog

	lineMu sync.Mutex
	lines  map[string]*line // waiters in line per key, under lineMu

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
	// held lists the leases held through this Locker, linked by
	// Lease.prev/next, newest first; epoch is the origin of Lease.dl.
	held, tail *Lease
	epoch      time.Time
}

// newLocker returns a Locker over the backend driver d (package driver's
// New, which backend constructors call). Zero fields of opts take their
// defaults; a field out of range (a negative duration, DriftFactor of 0.5
// or more, RetryMax below RetryMin, a TTL outside the backend's limits) is
// an error matching ErrInvalidConfig or ErrInvalidTTL, and it then returns
// no Locker (d stays open: it is the caller's to close).
func newLocker(d backend.Driver, opts *Options) (*Locker, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: nil driver", ErrInvalidConfig)
	}
	// The optional methods Name and DriftFactor of earlier versions are now
	// Guarantees.Backend and Limits.DriftFactor. A driver that still has
	// them would lose its drift margin without a word (a later Deadline
	// than its algorithm allows): refused instead.
	if _, ok := d.(interface{ DriftFactor() float64 }); ok {
		return nil, fmt.Errorf("%w: the driver has a DriftFactor method, which dlock no longer reads: return the factor in Limits().DriftFactor", ErrInvalidConfig)
	}
	if _, ok := d.(interface{ Name() string }); ok {
		return nil, fmt.Errorf("%w: the driver has a Name method, which dlock no longer reads: return the name in Guarantees().Backend", ErrInvalidConfig)
	}
	l := &Locker{drv: d, limits: d.Limits(), closeDone: make(chan struct{}), epoch: time.Now()}
	l.name = d.Guarantees().Backend
	if l.name == "" {
		l.name = "unknown"
	}
	if opts != nil {
		l.opts = *opts
	}
	o := &l.opts
	if err := o.check(l.limits); err != nil {
		return nil, err
	}
	l.wd.l = l
	l.closing, l.close = context.WithCancel(context.Background())
	if o.TTL == 0 {
		o.TTL = defaultTTL
		if m := l.limits.MaxTTL; m > 0 && m < o.TTL {
			o.TTL = m // a backend whose leases cannot last that long
		}
	}
	if o.RetryMin == 0 {
		o.RetryMin = defaultRetryMin
	}
	if o.RetryMax == 0 {
		o.RetryMax = max(defaultRetryMax, o.RetryMin)
	}
	if o.DriftFactor == 0 {
		o.DriftFactor = defaultDriftFactor
	}
	if df := l.limits.DriftFactor; df > o.DriftFactor {
		o.DriftFactor = df // the backend's algorithm needs more room
	}
	l.log = o.Logger
	if l.log == nil {
		l.log = slog.Default()
	}
	return l, nil
}

// check validates the fields of o against a backend's limits, without I/O.
// A zero field (a default) is valid.
func (o *Options) check(lim Limits) error {
	switch {
	case o.TTL < 0 || o.RetryMin < 0 || o.RetryMax < 0:
		return fmt.Errorf("%w: negative duration in Options (TTL %v, RetryMin %v, RetryMax %v)", ErrInvalidConfig, o.TTL, o.RetryMin, o.RetryMax)
	case o.DriftFactor < 0 || o.DriftFactor >= 0.5 || math.IsNaN(o.DriftFactor):
		return fmt.Errorf("%w: Options.DriftFactor %v: want 0 (default) up to 0.5", ErrInvalidConfig, o.DriftFactor)
	case o.RetryMin > 0 && o.RetryMax > 0 && o.RetryMax < o.RetryMin:
		return fmt.Errorf("%w: Options.RetryMax %v is below RetryMin %v", ErrInvalidConfig, o.RetryMax, o.RetryMin)
	case o.TTL > 0:
		return checkTTL(o.TTL, lim)
	}
	return nil
}

// Guarantees reports what the backend promises. WakesWaiters is filled in
// here: it is true when the backend tells waiters of releases.
func (l *Locker) Guarantees() Guarantees {
	g := l.drv.Guarantees()
	_, waiter := l.drv.(backend.Waiter)
	_, queuer := l.drv.(backend.Queuer)
	g.WakesWaiters = waiter || queuer
	return g
}

// Limits reports the backend's bounds on lease times (the shortest TTL it
// grants, and the longest if it has one). Acquires with a TTL outside them
// fail with ErrInvalidTTL before any I/O.
func (l *Locker) Limits() Limits {
	lim := l.limits
	lim.MinTTL = max(lim.MinTTL, minTTL)
	return lim
}

// Acquire takes the lock on key, waiting while another holder has it, until
// it is held, ctx ends, the Locker is closed, or the backend fails. When ctx
// ends first the error matches both ErrNotAcquired and ctx.Err(), and nothing
// is left behind on the server.
//
// A backend fails when three attempts in a row end with
// ErrUnavailable: a single failed attempt (a dropped connection, a Redlock
// round whose majority did not answer within the per-node timeout) is tried
// again after a short jittered delay, as the Redlock algorithm prescribes,
// and only a failure that persists ends the wait. Backends that queue
// waiters themselves (etcd, ZooKeeper) retry in their clients, and Acquire
// reports their failure as soon as they give up: etcd when a request gets
// no answer within its request timeout, ZooKeeper when its client has
// tried every server and reached none, and on both when a queued waiter's
// own lease or session can no longer be kept alive (each backend's package
// documentation gives the bounds). TryAcquire makes one attempt and
// reports its failure.
//
// On a backend without a queue of its own (Redis, Redlock), the waiters of
// one Locker on one key wait in line, in arrival order: only the first
// makes attempts, the others wait for their turn, so a release costs one
// attempt per Locker whatever the number of waiters.
func (l *Locker) Acquire(ctx context.Context, key string, opts *AcquireOptions) (*Lease, error) {
	if o := l.opts.Observer; o != nil {
		return l.observedAcquire(ctx, o, "acquire", key, opts, true)
	}
	return l.acquire(ctx, "acquire", key, opts, true, new(int))
}

// TryAcquire makes one attempt: it returns ErrNotAcquired at once if the key
// is held elsewhere.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts *AcquireOptions) (*Lease, error) {
	if o := l.opts.Observer; o != nil {
		return l.observedAcquire(ctx, o, "try-acquire", key, opts, false)
	}
	return l.acquire(ctx, "try-acquire", key, opts, false, new(int))
}

// acquire is Acquire (wait) or TryAcquire; *attempts counts the attempts
// made on the backend.
func (l *Locker) acquire(ctx context.Context, op, key string, opts *AcquireOptions, wait bool, attempts *int) (*Lease, error) {
	var ao AcquireOptions
	if opts != nil {
		ao = *opts
	}
	if err := l.check(key, &ao); err != nil {
		return nil, opErr(op, key, err)
	}
	if ao.Shared && !l.drv.Guarantees().Shared {
		return nil, opErr(op, key, fmt.Errorf("%w: %s serves no shared leases (semaphores, readers)", ErrUnsupported, l.name))
	}
	if err := l.enter(); err != nil {
		return nil, opErr(op, key, err)
	}
	defer l.inflight.Done()
	if err := ctx.Err(); err != nil {
		return nil, opErr(op, key, cancelled(ctx))
	}
	queuer, _ := l.drv.(backend.Queuer)
	var (
		lease *Lease
		err   error
	)
	// failures counts the attempts in a row that ended with a backend
	// failure; goOn reports whether the wait goes on after an attempt
	// that ended with err.
	failures := 0
	goOn := func(ctx context.Context, err error) bool {
		switch {
		case errors.Is(err, ErrNotAcquired):
			failures = 0
			return true
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
			failures++
			return failures < failedAttempts
		}
		return false
	}
	// tried: the first attempt was made here. A waiter that finds other
	// waiters of this Locker in line for the key makes none before its
	// turn: the head of the line attempts for all (see line).
	tried := false
	kind := lineKind{ao.Shared, ao.Permits}
	if !wait || (queuer == nil && !l.inLineAs(key, kind)) {
		*attempts++
		lease, err = l.try(ctx, key, &ao, wait, l.drv.TryAcquire)
		if err == nil || !wait || !goOn(ctx, err) {
			return lease, l.acquireErr(ctx, op, key, err)
		}
		tried = true
	}

	// Wait. From here on Close ends the wait: the context is cancelled
	// with ErrClosed as its cause.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(l.closing, func() { cancel(ErrClosed) })()
	if queuer != nil {
		// The backend's own queue does the waiting.
		*attempts++
		lease, err = l.try(ctx, key, &ao, true, queuer.Acquire)
		return lease, l.acquireErr(ctx, op, key, err)
	}
	ln, me := l.joinLine(key, kind)
	defer l.leaveLine(key, kind, ln, me)
	if !tried {
		err = fmt.Errorf("%w: waiting in line behind this Locker's other waiters for the key", ErrNotAcquired)
	}
	select {
	case <-me.Value.(chan struct{}):
	default:
		// Behind other waiters: an attempt made before joining the line
		// is stale when the turn comes (the wake-ups in between are
		// drained below), so the head's first attempt is made at once.
		tried = false
		select {
		case <-me.Value.(chan struct{}):
		case <-ctx.Done():
			return nil, l.acquireErr(ctx, op, key, err)
		}
	}
	// At the head of the line: only this waiter makes attempts now. A wake-up
	// that came before its turn is stale: its first attempt comes after it.
	wake := l.lineWatch(ln)
	if wake != nil {
		select {
		case <-wake:
		default:
		}
	}
	waiter, _ := l.drv.(backend.Waiter)
	for attempt, now := 0, !tried; ; {
		if now {
			// The head's first attempt, at once (it marks the lock as
			// waited for where the backend needs that to wake us).
			now = false
		} else if failures > 0 {
			// Back off from a failure, whatever a watch reports: a
			// release does not end it.
			if sleep(ctx, l.backoff(failureBackoff, failures-1), nil) != nil {
				// Report the last attempt's error with ctx's.
				return nil, l.acquireErr(ctx, op, key, err)
			}
		} else {
			var retryAfter time.Duration
			if held := (*backend.HeldError)(nil); errors.As(err, &held) {
				retryAfter = held.RetryAfter
			}
			// Watch once the server has answered that the key is held.
			watched := false
			if waiter != nil && wake == nil {
				ch, stop, werr := waiter.Watch(ctx, key)
				switch {
				case werr == nil:
					// Try again at once: the key may have been
					// freed before the watch was in force.
					l.setWatch(ln, ch, stop)
					wake, watched = ch, true
				case ctx.Err() != nil:
					return nil, l.acquireErr(ctx, op, key, werr)
				default:
					l.log.Warn("dlock: cannot watch for releases; polling instead", "key", key, "err", werr)
					waiter = nil
				}
			}
			if !watched {
				if sleep(ctx, l.retryDelay(attempt, retryAfter, wake != nil), wake) != nil {
					return nil, l.acquireErr(ctx, op, key, err)
				}
			}
			attempt++
		}
		*attempts++
		lease, err = l.try(ctx, key, &ao, true, l.drv.TryAcquire)
		if err == nil || !goOn(ctx, err) {
			return lease, l.acquireErr(ctx, op, key, err)
		}
	}
}

// line is a Locker's waiters for one key, in arrival order. Only the head
// of the line makes attempts; the others wait for their turn. So a release
// costs one attempt per Locker, not one per waiter (no herd), and the
// waiters of one Locker are served in order. The backend watch (Waiter) is
// the line's: made by the first head that needs it, kept while anyone
// waits, and read by the head only.
type line struct {
	waiters list.List // of chan struct{}, closed when that waiter's turn comes
	wake    <-chan struct{}
	stop    func()
	kinds   map[lineKind]int // how many waiters ask for each kind of lease
}

// lineKind is the kind of lease a waiter asks for: exclusive, or shared
// with its Permits.
type lineKind struct {
	shared  bool
	permits int
}

// inLineAs reports whether waiters of this Locker are in line for key, all
// of them asking for kind. A waiter of another kind makes an attempt
// before it joins the line: a shared request whose Permits differ from the
// key's holders must learn it at once (backend.PermitsError), not after
// the waiters ahead of it.
func (l *Locker) inLineAs(key string, kind lineKind) bool {
	l.lineMu.Lock()
	defer l.lineMu.Unlock()
	ln := l.lines[key]
	return ln != nil && ln.kinds[kind] == ln.waiters.Len()
}

// joinLine puts a waiter of kind at the end of key's line. Its channel is
// closed when it is the head.
func (l *Locker) joinLine(key string, kind lineKind) (*line, *list.Element) {
	l.lineMu.Lock()
	defer l.lineMu.Unlock()
	ln := l.lines[key]
	if ln == nil {
		if l.lines == nil {
			l.lines = map[string]*line{}
		}
		ln = &line{kinds: map[lineKind]int{}}
		l.lines[key] = ln
	}
	ln.kinds[kind]++
	turn := make(chan struct{})
	if ln.waiters.Len() == 0 {
		close(turn)
	}
	return ln, ln.waiters.PushBack(turn)
}

// leaveLine takes the waiter of kind out of key's line: the next one
// becomes the head if it was, and the watch ends with the last one.
func (l *Locker) leaveLine(key string, kind lineKind, ln *line, me *list.Element) {
	l.lineMu.Lock()
	if ln.kinds[kind]--; ln.kinds[kind] == 0 {
		delete(ln.kinds, kind)
	}
	head := ln.waiters.Front() == me
	ln.waiters.Remove(me)
	var stop func()
	switch {
	case ln.waiters.Len() == 0:
		delete(l.lines, key)
		stop = ln.stop
	case head:
		close(ln.waiters.Front().Value.(chan struct{}))
	}
	l.lineMu.Unlock()
	if stop != nil {
		stop()
	}
}

// lineWatch returns the line's wake-up channel (nil before a watch is
// made).
func (l *Locker) lineWatch(ln *line) <-chan struct{} {
	l.lineMu.Lock()
	defer l.lineMu.Unlock()
	return ln.wake
}

// setWatch records the line's watch, made by its head.
func (l *Locker) setWatch(ln *line, wake <-chan struct{}, stop func()) {
	l.lineMu.Lock()
	defer l.lineMu.Unlock()
	ln.wake, ln.stop = wake, stop
}

// acquireErr is the error of an acquire that ended with err (nil: success).
// When ctx has ended, the error says so: ErrClosed if Close ended it, else
// one that matches ErrNotAcquired and ctx.Err(), and ErrUnavailable as well
// when the last attempt failed (the backend's answer was a failure, or no
// answer came by the deadline), unless a cancellation cut that attempt
// short: that is the caller's doing, not the backend's.
func (l *Locker) acquireErr(ctx context.Context, op, key string, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil:
		return opErr(op, key, err)
	case context.Cause(ctx) == ErrClosed:
		return opErr(op, key, ErrClosed)
	case errors.Is(err, ErrUnavailable) && !errors.Is(err, context.Canceled):
		// The backend failed, or did not answer before the deadline:
		// say both. (A cancellation is the caller's, not a failure.)
		return opErr(op, key, fmt.Errorf("%w; last backend error: %w", cancelled(ctx), err))
	default:
		return opErr(op, key, cancelled(ctx))
	}
}

// sleep waits for d, a wake-up, or the end of ctx (then it returns ctx's
// error).
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wake:
	case <-t.C:
	}
	return nil
}

// check validates key and options before any I/O and fills in defaults.
func (l *Locker) check(key string, ao *AcquireOptions) error {
	if err := l.checkKey(key); err != nil {
		return err
	}
	if ao.TTL == 0 {
		ao.TTL = l.opts.TTL
	}
	if err := l.checkTTL(ao.TTL); err != nil {
		return err
	}
	if err := backend.ValidateHolder(ao.Holder); err != nil {
		return err
	}
	if ao.Permits < 0 {
		return fmt.Errorf("%w: Permits %d is negative", ErrInvalidConfig, ao.Permits)
	}
	if ao.Permits > 0 {
		ao.Shared = true
	}
	if ao.MaxHold < 0 {
		return fmt.Errorf("%w: MaxHold %v is negative", ErrInvalidConfig, ao.MaxHold)
	}
	if ao.AutoRefresh && ao.MaxHold == 0 {
		ao.MaxHold = defaultMaxHoldFactor * ao.TTL
		if ao.MaxHold/defaultMaxHoldFactor != ao.TTL { // overflow: a TTL of centuries
			ao.MaxHold = math.MaxInt64
		}
	}
	if ao.AutoRefresh && ao.MaxHold < ao.TTL {
		return fmt.Errorf("%w: MaxHold %v is shorter than the TTL %v it is to bound", ErrInvalidConfig, ao.MaxHold, ao.TTL)
	}
	if granted := max(roundUp(ao.TTL, l.limits.Resolution), l.limits.MinGrant); ao.AutoRefresh && ao.MaxHold < granted {
		return fmt.Errorf("%w: MaxHold %v is shorter than the TTL %v it is to bound, which the backend grants as %v",
			ErrInvalidConfig, ao.MaxHold, ao.TTL, granted)
	}
	return nil
}

// roundUp rounds d up to a multiple of r (r 0: d).
func roundUp(d, r time.Duration) time.Duration {
	if r <= 0 || d%r == 0 {
		return d
	}
	return d - d%r + r
}

// watchdogTTL is the TTL the watchdog asks for when left remains until
// MaxHold: the lease's ttl, or less near MaxHold, so that what the backend
// grants (rounded up to its Resolution, and raised to floor, the least it
// was seen to grant) does not end past MaxHold. ok is false when no TTL the
// backend accepts fits: the lease is then left to run out.
func (l *Locker) watchdogTTL(ttl, left, floor time.Duration) (next time.Duration, ok bool) {
	next = min(ttl, left)
	if r := l.limits.Resolution; r > 0 && roundUp(next, r) > left {
		next = left.Truncate(r)
	}
	if floor > left || l.checkTTL(next) != nil {
		return 0, false
	}
	return next, true
}

func (l *Locker) checkKey(key string) error {
	if err := backend.ValidateKey(key); err != nil {
		return err
	}
	return l.drv.ValidateKey(key)
}

func (l *Locker) checkTTL(ttl time.Duration) error { return checkTTL(ttl, l.limits) }

// checkTTL checks ttl against dlock's floor and a backend's limits.
func checkTTL(ttl time.Duration, lim Limits) error {
	floor := max(minTTL, lim.MinTTL)
	switch {
	case ttl < 0:
		return fmt.Errorf("%w: %v is negative", ErrInvalidTTL, ttl)
	case ttl < floor:
		return fmt.Errorf("%w: %v is below the floor of %v", ErrInvalidTTL, ttl, floor)
	case lim.MaxTTL > 0 && ttl > lim.MaxTTL:
		return fmt.Errorf("%w: %v is above the backend's ceiling of %v", ErrInvalidTTL, ttl, lim.MaxTTL)
	}
	return nil
}

// link puts le at the head of the held list. It also looks at the oldest
// entry: if its deadline has passed it is returned, for the caller to end
// (with checkDeadline, after releasing l.mu); otherwise it moves to the
// head. So a lease that nobody releases or watches leaves the list after a
// bounded number of later acquires, without a timer per lease. l.mu is held.
func (l *Locker) link(le *Lease) (expired *Lease) {
	if t := l.tail; t != nil && int64(time.Since(l.epoch)) >= t.dl.Load() {
		expired = t
	} else if t != nil && t != l.held {
		l.unlink(t)
		l.pushFront(t)
	}
	l.pushFront(le)
	return expired
}

func (l *Locker) pushFront(le *Lease) {
	le.prev, le.next = nil, l.held
	if l.held != nil {
		l.held.prev = le
	} else {
		l.tail = le
	}
	l.held = le
}

// unlink removes le from the held list, if it is there. l.mu is held.
func (l *Locker) unlink(le *Lease) {
	if le.prev != nil {
		le.prev.next = le.next
	} else if l.held == le {
		l.held = le.next
	} else {
		return // not in the list
	}
	if le.next != nil {
		le.next.prev = le.prev
	} else {
		l.tail = le.prev
	}
	le.prev, le.next = nil, nil
}

// enter registers an operation in flight, or returns ErrClosed. The caller
// calls l.inflight.Done when the operation ends.
func (l *Locker) enter() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.inflight.Add(1)
	return nil
}

// try makes one attempt and wraps a grant in a Lease; wait tells an
// attempt of a waiting Acquire from a TryAcquire.
func (l *Locker) try(ctx context.Context, key string, ao *AcquireOptions, wait bool, acquire func(context.Context, backend.Request) (backend.Lease, error)) (*Lease, error) {
	start := time.Now()
	req := backend.Request{Key: key, TTL: ao.TTL, Holder: ao.Holder, Shared: ao.Shared, Permits: ao.Permits}
	if wait {
		req.Wait = 2 * l.opts.RetryMax
	}
	bl, err := acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	if a, ok := bl.(backend.Anchored); ok {
		start = a.Anchor() // earlier than start too: a renewal before the call
	}
	if ttl := bl.TTL(); !time.Now().Before(start.Add(ttl - l.margin(ttl))) {
		// The grant came back too late to be of use: the server may
		// have let it lapse, and someone else may hold the lock now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeReleaseTimeout)
		defer cancel()
		_ = bl.Release(ctx)
		return nil, fmt.Errorf("%w: the grant arrived after its deadline (the attempt took %v, the TTL is %v); lock given back",
			ErrUnavailable, time.Since(start).Round(time.Millisecond), ttl)
	}
	return l.newLease(key, bl, start, ao)
}

// retryDelay is the wait before the next attempt: jittered exponential
// backoff from RetryMin to RetryMax, never longer than the holder's remaining
// lease (when known). While a backend watch is in force the watch wakes us,
// and the delay is only the fallback poll.
func (l *Locker) retryDelay(attempt int, remaining time.Duration, watching bool) time.Duration {
	var d time.Duration
	if watching {
		d = jitter(l.opts.RetryMax)
	} else {
		d = l.backoff(l.opts.RetryMin, attempt)
	}
	if remaining > 0 && remaining < d {
		// The key expires by then: try right after.
		return remaining + time.Millisecond
	}
	return d
}

// failureBackoff is the first delay after a failed attempt (or RetryMin, if
// larger): long enough for a dropped connection to be re-established.
const failureBackoff = 50 * time.Millisecond

// backoff is the jittered delay before retry n (from 0): base doubled n
// times, at most RetryMax (or base, if larger).
func (l *Locker) backoff(base time.Duration, n int) time.Duration {
	base = max(base, l.opts.RetryMin)
	d := base
	for i := 0; i < n && d < l.opts.RetryMax; i++ {
		d *= 2
	}
	return jitter(min(d, max(l.opts.RetryMax, base)))
}

// jitter spreads d over [d/2, d] (full jitter), so that competing waiters
// spread out.
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// margin is the part of a TTL not trusted, for drift between clocks.
func (l *Locker) margin(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*l.opts.DriftFactor) + 2*time.Millisecond
}

// Close releases every lease still held through this Locker (in parallel,
// each within a few seconds; failures are logged and those locks then end
// with their TTL), ends waits in progress with ErrClosed, and closes the
// backend. It waits for operations in progress: an acquire attempt's round
// trip, and Refresh or Release calls, which their own contexts bound.
// Leases end with Err matching ErrClosed, and further calls return
// ErrClosed. Close is idempotent: a later call waits for the first to finish
// and returns nil.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.closeDone // a concurrent Close returns when the first is done
		return nil
	}
	defer close(l.closeDone)
	l.closed = true
	l.close()
	var leases []*Lease
	for le := l.held; le != nil; le = le.next {
		leases = append(leases, le)
	}
	l.mu.Unlock()

	// Work under the leases' contexts stops before any lock is given
	// back, so it cannot go on while a new holder has the lock.
	for _, le := range leases {
		le.endContexts(ErrClosed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeReleaseTimeout)
	var wg sync.WaitGroup
	for _, le := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := le.release(ctx, ErrClosed); err != nil && !errors.Is(err, ErrNotHeld) {
				l.log.Warn("dlock: release at close failed; the lock stays until its TTL ends", "key", le.key, "err", err)
			}
			le.end(ErrClosed, observe.EndClosed) // if the release failed
		}()
	}
	wg.Wait()
	cancel()
	l.inflight.Wait()
	l.bg.Wait()
	l.observers.Wait()
	if err := l.drv.Close(); err != nil {
		return opErr("close", "", err)
	}
	return nil
}

const closeReleaseTimeout = 5 * time.Second
