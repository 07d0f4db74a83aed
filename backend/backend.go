// Package backend defines the narrow interfaces a dlock backend implements,
// and the sentinel errors every layer shares.
//
// This is the "driver" layer, in the manner of gocloud.dev's blob/driver: the
// portable types in package dlock own everything that must behave the same on
// every backend (key and TTL validation, defaults, the one retry/wait loop,
// automatic refresh, the lease-lost signal, the closed state and error
// wrapping). A backend implements only what differs: one acquire attempt,
// refresh, release, and optionally a native way to wait for a key to be freed
// ([Waiter], or a whole queue, [Queuer]), a way to learn that a lease was
// lost ([LossNotifier]) and a read-only view of its locks ([Inspector]).
//
// Guarantees the dlock layer gives a backend:
//   - keys have passed [ValidateKey] and [Driver.ValidateKey];
//   - TTLs are > 0 and at least [Limits.MinTTL];
//   - ctx is never nil;
//   - no call is made after [Driver.Close] has been called, and Close is
//     called at most once;
//   - Refresh and Release of one [Lease] are never called concurrently, and
//     nothing is called on a Lease after its Release returned nil or an
//     error wrapping [ErrNotHeld] (after other errors, Release may be
//     called again).
//
// Guarantees a backend gives the dlock layer:
//   - every error it returns wraps one of the sentinels below where one fits
//     ([ErrNotAcquired] when the key is held elsewhere, [ErrNotHeld] when
//     the lease is no longer ours, [ErrUnavailable] when the server could not
//     be reached or answered with an error), so callers can test with
//     errors.Is;
//   - it never returns (nil, nil).
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// The error vocabulary of dlock. Every error that dlock returns wraps one of
// these (test with errors.Is). Package dlock re-exports them under the same
// names.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or the
	// acquire ended before the lock was obtained (Acquire whose context
	// ended; the error then also matches ctx.Err()).
	ErrNotAcquired = errors.New("dlock: lock not acquired")
	// ErrNotHeld: the lease is no longer held by this holder — it was
	// released already, or it expired and perhaps another holder owns the
	// key now. Release and Refresh return it; nothing was changed.
	ErrNotHeld = errors.New("dlock: lock not held")
	// ErrLeaseLost: the lease ended without Release — its deadline passed
	// without a successful refresh, the server dropped it, or the session
	// behind it ended. Lease.Err returns it after Lease.Done is closed.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrClosed: the Locker (or the backend) was closed.
	ErrClosed = errors.New("dlock: locker closed")
	// ErrInvalidKey: the key is empty, too long, not valid UTF-8, or one the
	// backend cannot represent. Returned before any I/O.
	ErrInvalidKey = errors.New("dlock: invalid key")
	// ErrInvalidTTL: the TTL is not positive, or below the backend's floor.
	// Returned before any I/O; dlock never clamps a TTL silently.
	ErrInvalidTTL = errors.New("dlock: invalid ttl")
	// ErrInvalidConfig: a bad option, URL or URL parameter. Returned before
	// any I/O, with one exception: a semaphore acquire whose number of
	// permits differs from that of the key's holders learns it from the
	// server (*[PermitsError]).
	ErrInvalidConfig = errors.New("dlock: invalid configuration")
	// ErrUnsupported: the backend does not serve what was asked (shared
	// leases on Redlock, see [Guarantees].Shared). Returned before any
	// I/O.
	ErrUnsupported = errors.New("dlock: not supported by this backend")
	// ErrUnavailable: the backend could not be reached, answered with an
	// error, or could not give the promised durability (for example too
	// few replicas acknowledged a write). The operation may or may not have
	// taken effect on the server; dlock cleans up what it can.
	ErrUnavailable = errors.New("dlock: backend unavailable")
)

// MaxKeyLen is the longest key, in bytes, that dlock accepts.
const MaxKeyLen = 512

// MinTTL is the shortest lease the dlock layer grants on any backend: below
// it the safety margin of Lease.Deadline would eat the whole lease. A
// backend may have a higher floor ([Limits.MinTTL]); one whose leases
// cannot be that short refuses to open.
const MinTTL = 10 * time.Millisecond

// DefaultTTL is the lease time of acquires when neither the Locker's
// Options nor the acquire set one (or the backend's [Limits.MaxTTL] if
// that is shorter). A backend that checks its options against the TTLs
// to come uses it for an unset Options.TTL.
const DefaultTTL = 30 * time.Second

// ValidateKey applies the rules every backend shares: a key is non-empty, at
// most [MaxKeyLen] bytes, valid UTF-8 and free of NUL bytes. The error wraps
// [ErrInvalidKey].
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: contains a NUL byte at %d", ErrInvalidKey, i)
		}
	}
	return nil
}

// Token is a fencing token: it increases strictly per key from one holder to
// the next (as far as the backend's [Guarantees].Fencing promises). 0 means
// the backend issues none. Package dlock re-exports it as dlock.Token.
type Token uint64

// FencingGrade says how far a backend's fencing tokens can be trusted.
type FencingGrade int

const (
	// FencingNone: the backend issues no tokens; Lease.Token is 0.
	FencingNone FencingGrade = iota
	// FencingBestEffort: tokens increase per key in normal operation, but
	// a crash, failover or clock step can make a later holder receive a
	// token that is not larger (the backend documents exactly when). Good
	// enough to detect most stale writers; not proof against all.
	FencingBestEffort
	// FencingConsensus: tokens come from a single totally ordered source
	// that does not lose acknowledged state (a consensus log such as etcd's
	// revision or ZooKeeper's zxid, or one process's memory): a later
	// holder always has a larger token.
	FencingConsensus
)

// String returns "none", "best-effort" or "consensus".
func (g FencingGrade) String() string {
	switch g {
	case FencingNone:
		return "none"
	case FencingBestEffort:
		return "best-effort"
	case FencingConsensus:
		return "consensus"
	}
	return fmt.Sprintf("FencingGrade(%d)", int(g))
}

// Guarantees is what a backend promises. The conformance suite gates its
// capability-dependent cases on these fields, never on Backend (the name).
type Guarantees struct {
	// Backend names the backend, a short constant ("memory", "redis",
	// "redlock", "etcd", "zookeeper"): the backend attribute of the events
	// a Locker's Observer receives (metrics and traces), and the name in
	// some of its errors. Empty means "unknown".
	Backend string
	// Fencing is the grade of the fencing tokens.
	Fencing FencingGrade
	// ToleratedFailures is how many server nodes can fail (crash or be
	// partitioned away) without losing mutual exclusion. A single Redis
	// tolerates 0.
	ToleratedFailures int
	// FIFO reports that waiters are granted the lock in arrival order.
	FIFO bool
	// Shared reports that the backend serves shared leases ([Request].Shared:
	// semaphore permits and readers' leases of read-write locks), with the
	// same Fencing, ToleratedFailures, FIFO and ClockDependent as its
	// exclusive ones. Without it the dlock layer refuses shared acquires
	// with [ErrUnsupported] before any I/O.
	Shared bool
	// WakesWaiters reports that a waiting Acquire is woken when the holder
	// releases, rather than polling. dlock.Locker.Guarantees sets it from
	// whether the backend implements [Waiter] or [Queuer]; a backend leaves
	// it false.
	WakesWaiters bool
	// ClockDependent reports that mutual exclusion rests on timing
	// assumptions: bounded clock drift between client and servers, and
	// bounded process pauses and network delays. Such a lock is fit for
	// efficiency (avoiding duplicate work), not for correctness, unless
	// the protected resource checks fencing tokens.
	ClockDependent bool
	// Notes says, in one or two sentences, when the promises above fail.
	Notes string
}

// Limits are the bounds a backend puts on its inputs, checked by the dlock
// layer before any I/O.
type Limits struct {
	// MinTTL is the shortest lease the backend can grant.
	MinTTL time.Duration
	// MaxTTL is the longest lease the backend can grant; 0 means no limit.
	MaxTTL time.Duration
	// Resolution is the unit the server's lease times come in: it rounds a
	// TTL that is not a multiple of Resolution up to the next one (etcd:
	// whole seconds). 0 means TTLs are granted as asked (or truncated,
	// never raised). The dlock layer uses it to keep an auto-refreshed
	// lease within its MaxHold.
	Resolution time.Duration
	// MinGrant is the shortest lease the server actually grants: it raises
	// a TTL below MinGrant to MinGrant (etcd raises TTLs below about 1.5 ×
	// its election timeout). 0 means TTLs are not raised. The dlock layer
	// uses it to keep an auto-refreshed lease within its MaxHold.
	MinGrant time.Duration
	// DriftFactor is the share of a TTL the backend's algorithm allows for
	// clock drift, when it allows more than the dlock layer's default
	// (Redlock's DriftFactor option): the Locker then counts
	// Lease.Deadline with this larger factor. 0 means the default.
	DriftFactor float64
}

// Driver is one backend instance: a connection (or connection pool) to the
// servers, shared by all leases taken through one dlock.Locker.
type Driver interface {
	// TryAcquire makes one attempt to take the lock on req.Key for req.TTL,
	// storing req.Holder with it. When
	// the key is held elsewhere it returns an error wrapping
	// [ErrNotAcquired]; if it is a *[HeldError], RetryAfter bounds how
	// long the key stays held.
	//
	// When TryAcquire returns an error other than ErrNotAcquired, the
	// backend has undone whatever it may have written.
	TryAcquire(ctx context.Context, req Request) (Lease, error)
	// ValidateKey applies the backend's own key rules, beyond the shared
	// [ValidateKey]. The error wraps [ErrInvalidKey].
	ValidateKey(key string) error
	// Limits returns the backend's TTL bounds.
	Limits() Limits
	// Guarantees returns what the backend promises.
	Guarantees() Guarantees
	// Close releases the backend's resources. Clients the caller passed in
	// are not closed; clients the backend built itself (from a URL) are.
	Close() error
}

// Request is one acquire, as the dlock layer hands it to [Driver.TryAcquire]
// and [Queuer.Acquire].
type Request struct {
	// Key is the lock key. It has passed [ValidateKey] and
	// [Driver.ValidateKey].
	Key string
	// TTL is the lease time asked for: > 0 and within [Limits].
	TTL time.Duration
	// Holder describes who holds the lock (dlock.AcquireOptions.Holder),
	// "" for nobody in particular. It has passed [ValidateHolder]. The
	// backend stores it with the lock, atomically with the grant, and its
	// [Inspector] returns it in [LockInfo].Holder while the lease is held.
	Holder string
	// Shared asks for a shared lease instead of an exclusive one: one
	// permit of a semaphore of Permits (> 0) permits, or, with Permits 0,
	// a reader's lease of a read-write lock (no bound on the number of
	// readers). It is set only on a Driver whose [Guarantees].Shared is
	// true. See "Shared leases" below.
	Shared bool
	// Permits is the size of the semaphore a shared request asks a permit
	// of (0: readers, unbounded); always 0 when Shared is false. The
	// dlock layer has checked that it is not negative.
	Permits int
	// Wait is 0 for a single attempt (TryAcquire); for an attempt of a
	// waiting Acquire on a Driver without a [Queuer], it bounds the time
	// until that waiter's next attempt (2 × dlock.Options.RetryMax). A
	// backend without a queue keeps shared requests out for that long
	// after an exclusive attempt found the key held by shared leases, so
	// that a stream of readers cannot starve a writer.
	Wait time.Duration
}

// Shared leases.
//
// A backend whose [Guarantees].Shared is true keeps, for every key, at
// every moment, either at most one valid exclusive lease, or only shared
// leases, all of one Permits, at most Permits of them when Permits > 0.
// In detail:
//   - A shared request on a key whose shared holders asked for another
//     Permits fails at once with a *[PermitsError]; it neither waits nor
//     takes anything (it may have joined a queue for a moment). On a
//     backend with a queue, a waiter ahead of it with another Permits
//     (about to fail, or to be a holder) makes the request either fail
//     with a *[PermitsError] or wait behind it (each backend says which),
//     never be granted beside it; a TryAcquire that waits for nothing
//     else reports [ErrNotAcquired]. An exclusive request on
//     a semaphore's key is allowed: it waits for every permit to be given
//     back, like a writer.
//   - Writers are not starved: a shared request is not granted while an
//     exclusive one waits for the key (on a [Queuer], an exclusive waiter
//     queued ahead of it; on other backends, an exclusive attempt of a
//     waiting Acquire that found the key held by shared leases within
//     the last [Request].Wait: it reserves the key for that long, even
//     once the readers are gone, so that no reader slips in before the
//     writer's next attempt).
//   - Every grant's token, shared or exclusive, is larger than the token
//     of every earlier grant on the key (as far as Fencing promises), so
//     a resource that checks writers' tokens rejects a writer whose
//     lease was lost once another writer, or a reader after it, holds.
//   - Release of a shared lease wakes waiters as a mutex's release does;
//     a queue grants in arrival order, a reader together with the readers
//     queued next to it.

// PermitsError is returned (wrapped) by a shared acquire whose number of
// permits differs from that of the key's holders: every holder of one
// semaphore must agree on its size. It matches [ErrInvalidConfig].
type PermitsError struct {
	// Asked is the Permits of the request, Held that of the key's holders
	// (0: readers of a read-write lock).
	Asked, Held int
}

// Error implements error.
func (e *PermitsError) Error() string {
	name := func(n int) string {
		if n == 0 {
			return "a read-write lock's reader"
		}
		return fmt.Sprintf("a permit of %d", n)
	}
	return fmt.Sprintf("%v: asked for %s, but the key's holders hold %s", ErrInvalidConfig, name(e.Asked), name(e.Held))
}

// Unwrap makes a PermitsError match [ErrInvalidConfig].
func (e *PermitsError) Unwrap() error { return ErrInvalidConfig }

// MaxHolderLen is the longest holder description, in bytes, that dlock
// accepts.
const MaxHolderLen = 256

// ValidateHolder checks a holder description: at most [MaxHolderLen] bytes
// of valid UTF-8, every character printable as unicode.IsPrint defines it
// (letters, marks, numbers, punctuation, symbols and the ASCII space; no
// control, format or separator characters): it is shown by `dlock inspect`
// and in logs, and must neither move a terminal's cursor nor hide or
// reorder text (a right-to-left override, a zero-width space). The error
// wraps [ErrInvalidConfig].
func ValidateHolder(h string) error {
	switch {
	case len(h) > MaxHolderLen:
		return fmt.Errorf("%w: holder: %d bytes, longer than %d", ErrInvalidConfig, len(h), MaxHolderLen)
	case !utf8.ValidString(h):
		return fmt.Errorf("%w: holder: not valid UTF-8", ErrInvalidConfig)
	}
	for i, r := range h {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: holder: character %U at byte %d is not printable", ErrInvalidConfig, r, i)
		}
	}
	return nil
}

// Lease is one held lock, as returned by [Driver.TryAcquire].
type Lease interface {
	// Token is the fencing token of this grant (0 if the backend issues
	// none); the dlock layer hands it out as a [Token]. (It is a uint64
	// here so that drivers written before Token stay valid.)
	Token() uint64
	// TTL is the lease time the server granted. It may differ from what
	// was asked: etcd raises TTLs below its minimum; Redis truncates to
	// whole milliseconds. The dlock layer computes Lease.Deadline from it.
	TTL() time.Duration
	// Refresh extends the lease to ttl from now and returns the TTL
	// granted. If the lease is no longer ours it returns an error wrapping
	// [ErrNotHeld] and changes nothing.
	Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error)
	// Release gives the lock up. If the lease is no longer ours it returns
	// an error wrapping [ErrNotHeld] and changes nothing.
	Release(ctx context.Context) error
}

// HeldError is returned (wrapped or not) by [Driver.TryAcquire] when the key
// is held elsewhere. It matches [ErrNotAcquired].
type HeldError struct {
	// RetryAfter is an upper bound on how long the current holder's lease
	// lasts, if the backend knows it (0 if not).
	RetryAfter time.Duration
}

// Error implements error.
func (e *HeldError) Error() string { return ErrNotAcquired.Error() + ": held by another holder" }

// Unwrap makes a HeldError match [ErrNotAcquired].
func (e *HeldError) Unwrap() error { return ErrNotAcquired }

// Waiter is implemented by backends that can tell a waiter when a key may
// have been freed, instead of leaving it to poll.
type Waiter interface {
	// Watch starts watching key for releases. It returns once the watch is
	// in force: a release that happens after Watch has returned and a later
	// [Driver.TryAcquire] of key has found it held is reported on the
	// channel (a backend may need that attempt to learn that the lock is
	// waited for; the dlock layer always makes it). The channel receives
	// (or is closed) when the key may be free; spurious wake-ups are
	// allowed. A backend over several servers may miss a release on a
	// server it cannot reach (Redlock: a node that is down); it documents
	// when, and the dlock layer's fallback poll (Options.RetryMax) bounds
	// the wait then. stop ends the watch and must be called exactly once.
	Watch(ctx context.Context, key string) (wake <-chan struct{}, stop func(), err error)
}

// Queuer is implemented by backends with a native wait queue on the server
// (etcd, ZooKeeper): waiters line up in arrival order, each is woken when its
// turn comes, and the lock goes to them first come, first served. The dlock
// layer's Acquire then calls Queuer.Acquire instead of its own
// try-and-wait loop; TryAcquire still calls [Driver.TryAcquire].
type Queuer interface {
	// Acquire joins the queue for req.Key and returns when the lock is
	// granted. When ctx ends first it returns an error wrapping ctx.Err()
	// (and [ErrNotAcquired]) and removes this waiter from the server, at
	// once or in the background after returning (bounded; Close waits for
	// it).
	// While it waits, the backend keeps the waiter's own lease alive; a
	// waiter whose lease is lost while queued returns an error, never a
	// grant. The returned Lease's TTL counts from the moment given by
	// [Anchored] if it implements it, else from the start of the call.
	Acquire(ctx context.Context, req Request) (Lease, error)
}

// Anchored is implemented by a [Lease] whose TTL counts from a request other
// than the start of the call that returned it: one sent after it (for
// example a keepalive sent while the waiter was queued), or before it (a
// pooled etcd lease renewed just before, handed out without a keepalive).
// The dlock layer counts Lease.Deadline from Anchor, whether it is earlier
// or later than the start of the call, so Anchor must be the sending of a
// real request whose TTL the server counts from then at the latest.
type Anchored interface {
	// Anchor returns the local time, with its monotonic clock reading, at
	// which the request that set the lease's current expiry was sent.
	Anchor() time.Time
}

// LossNotifier is implemented by a [Lease] whose backend learns of loss by
// itself (a session that expired, a watch on the lock key).
type LossNotifier interface {
	// NotifyLoss registers f, to be called at most once, when the backend
	// learns that the lease is lost; err wraps [ErrLeaseLost] and says
	// why. The dlock layer calls NotifyLoss once, right after the grant
	// and before any Refresh or Release of the lease. f does not block
	// (it ends the lease under a mutex), and may be called from any
	// goroutine, or from within NotifyLoss if the loss is known already.
	// The lease's own Release is not a loss: the backend must not report
	// the effect of its own release (say, the deletion of the lock key)
	// as one. A loss from elsewhere while a Release is under way is
	// reported (the dlock layer then ends the lease as lost); a call of
	// f after Release has returned is ignored.
	//
	// A backend should not keep a goroutine per lease for this: one
	// watch or event loop per Driver that dispatches to the leases keeps
	// a Locker with many leases at O(1) goroutines.
	NotifyLoss(f func(err error))
}

// BatchRefresher is implemented by a [Driver] that refreshes many leases
// in fewer round trips than one each: a pipeline on Redis, one keepalive
// stream on etcd, one read that proves the session on ZooKeeper. The dlock
// layer's watchdog refreshes the auto-refreshed leases that come due
// together through one RefreshBatch call.
type BatchRefresher interface {
	// RefreshBatch refreshes each reqs[i].Lease to reqs[i].TTL from now,
	// with the meaning of [Lease.Refresh], and sets either
	// reqs[i].Granted or reqs[i].Err (wrapping [ErrNotHeld] for a lease
	// that is no longer ours, [ErrUnavailable] when the outcome is not
	// known). Every lease was granted by this Driver, and none is
	// refreshed or released concurrently with the call. It returns once
	// every request has an outcome, or when ctx ends: requests without
	// an outcome then get an error wrapping ErrUnavailable and ctx.Err().
	RefreshBatch(ctx context.Context, reqs []RefreshRequest)
}

// RefreshRequest is one lease's part of a [BatchRefresher.RefreshBatch]
// call.
type RefreshRequest struct {
	// Lease and TTL are the lease to refresh and the TTL asked for.
	Lease Lease
	TTL   time.Duration
	// Granted is the TTL granted, set on success.
	Granted time.Duration
	// Err is set on failure.
	Err error
}

// LockInfo is what an [Inspector] reads about one key: who holds it, for how
// long yet, and how many wait. It is a snapshot, stale as soon as it is
// read; use it for diagnostics, never to decide who may act.
type LockInfo struct {
	// Held reports that a lease on the key is held.
	Held bool
	// Token is the holder's fencing token (as its Lease.Token returns),
	// or 0 when the key is free or the backend cannot tell.
	Token Token
	// TTL is the time left on the holder's lease, as the server counts
	// it, or 0 when the key is free or the backend cannot tell (a
	// ZooKeeper lock lasts as long as its holder's session).
	TTL time.Duration
	// Holder is the holder's description ([Request].Holder), "" when the
	// key is free or the holder gave none.
	Holder string
	// Waiters is the number of waiters queued on the server behind the
	// holder, or -1 when the backend cannot tell (Redis and Redlock keep
	// no queue: their waiters poll or watch from their own processes).
	Waiters int
	// Shared reports that the key is held by shared leases (semaphore
	// permits or readers, [Request].Shared).
	Shared bool
	// Permits is the number of permits of the key's semaphore (the
	// Permits its shared holders asked for); 0 for an exclusive holder,
	// readers, or a free key.
	Permits int
	// Holders lists every valid lease on the key, oldest grant first: one
	// for an exclusive lease, one per permit or reader held. Token, TTL
	// and Holder above are those of Holders[0]. Empty when the key is
	// free.
	Holders []Holding
}

// Holding is one lease in [LockInfo].Holders.
type Holding struct {
	// Token, TTL and Holder mean what they mean in [LockInfo].
	Token  Token
	TTL    time.Duration
	Holder string
}

// ChangeWatcher is implemented by a [Driver] that learns from its servers
// when the holder of a key changes (etcd: a watch on the key's range;
// ZooKeeper: a child watch), so that an observer of a key (an election's
// follower, dlock.ElectionOptions.OnLeader) need not poll. Without it, the
// dlock layer polls [Inspector.Inspect].
type ChangeWatcher interface {
	// WatchChanges starts watching key. It returns once the watch is in
	// force: every change of key's holder after that (a grant, a release,
	// an expiry, a waiter joining or leaving the queue) makes the channel
	// receive. The channel holds one pending signal (changes in a burst
	// may merge into one receive) and spurious receives are allowed. The
	// channel is closed when the watch ends by itself (the connection or
	// session was lost); the caller then reads the state again and
	// watches anew. stop ends the watch and must be called exactly once.
	WatchChanges(ctx context.Context, key string) (changed <-chan struct{}, stop func(), err error)
}

// Inspector is implemented by a [Driver] that can read the state of its locks
// without changing it. The dlock layer has validated key (as for
// TryAcquire) and limit (> 0) before the call.
type Inspector interface {
	// Inspect reads who holds key. It writes nothing: no lease is taken,
	// refreshed or released, and no waiter is woken.
	Inspect(ctx context.Context, key string) (LockInfo, error)
	// Keys lists up to limit keys (dlock keys, not the server's own
	// names) that have a holder or a waiter on the server, under this
	// Driver's prefix or namespace only, in no particular order. It
	// returns an empty list when the key space is empty.
	Keys(ctx context.Context, limit int) ([]string, error)
}
