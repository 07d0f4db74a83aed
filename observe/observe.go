// Package observe defines the events a dlock.Locker reports to an
// [Observer], for metrics and traces, in the manner of net/http/httptrace.
// Set one in dlock.Options.Observer; package github.com/dlock-go/dlock/otel
// (a module of its own) adapts them to OpenTelemetry. Users who only take
// locks never need this package.
package observe

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// Observer receives the events of a Locker's acquires and leases, for
// metrics and traces. Set it in dlock.Options.Observer; a nil Observer (the
// default) costs a nil check per event and nothing else. Package
// github.com/dlock-go/dlock/otel, a module of its own, adapts it to
// OpenTelemetry; package dlock itself has no such dependency.
//
// The methods are called on the goroutine of the operation they report
// (LeaseEnd: on a goroutine of its own), never with a lock of the Locker or
// of a Lease held, so they may call the Locker and its leases, with one
// exception: LeaseEnd and a background Refresh must not call the Locker's
// Close (Close waits for LeaseEnd calls in progress and for the watchdog,
// so it would wait for itself; start a goroutine to close it). They must be
// safe for concurrent use, and fast: AcquireStart and AcquireEnd delay the
// acquire, and Refresh of a background refresh delays the watchdog's other
// leases.
//
// Per lease, AcquireStart and AcquireEnd (with Outcome AcquireAcquired)
// come first, and exactly one LeaseEnd follows, after AcquireEnd. A held-
// leases gauge is thus AcquireEnd events with Outcome AcquireAcquired less
// LeaseEnd events. Refresh and Release events are not ordered with
// LeaseEnd: the LeaseEnd of a lease that a Release or Refresh call ended
// may come before that call's event, and a call on a lease that has ended
// (a second Release) reports its event after the LeaseEnd.
type Observer interface {
	// AcquireStart is called when Acquire or TryAcquire begins, before
	// the key and options are checked. The context it returns is the one
	// the acquire runs with (and passes to the backend): a tracer puts
	// its span there.
	AcquireStart(ctx context.Context, e AcquireStartEvent) context.Context
	// AcquireEnd is called when the acquire returns, with the context
	// AcquireStart returned.
	AcquireEnd(ctx context.Context, e AcquireEndEvent)
	// Refresh is called when a refresh of a lease has an outcome: a call
	// of Lease.Refresh, or a background refresh of the watchdog (then ctx
	// is the watchdog's, not a caller's).
	Refresh(ctx context.Context, e RefreshEvent)
	// Release is called when a call of Lease.Release returns. (Close
	// releases the leases still held without Release events; their
	// LeaseEnd says EndClosed.)
	Release(ctx context.Context, e ReleaseEvent)
	// LeaseEnd is called once for each lease that AcquireEnd reported,
	// when it ends: released, lost, or closed with its Locker.
	LeaseEnd(e LeaseEndEvent)
}

// AcquireStartEvent describes an acquire that begins.
type AcquireStartEvent struct {
	// Backend names the backend (its backend.Guarantees.Backend):
	// "memory", "redis", "redlock", "etcd", "zookeeper", or "unknown".
	Backend string
	// Key is the lock key.
	Key string
	// Try is true for TryAcquire (one attempt), false for Acquire.
	Try bool
}

// AcquireOutcome is how an acquire ended.
type AcquireOutcome string

// The outcomes of an acquire.
const (
	// AcquireAcquired: the lock is held; the acquire returned a Lease.
	AcquireAcquired AcquireOutcome = "acquired"
	// AcquireNotAcquired: TryAcquire found the key held elsewhere.
	AcquireNotAcquired AcquireOutcome = "not_acquired"
	// AcquireCancelled: the caller's context ended (cancelled, or its
	// deadline passed) before the lock was obtained.
	AcquireCancelled AcquireOutcome = "cancelled"
	// AcquireError: any other error (the backend failed, bad input, the
	// Locker closed).
	AcquireError AcquireOutcome = "error"
)

// AcquireEndEvent describes the end of an acquire.
type AcquireEndEvent struct {
	Backend, Key string
	Try          bool
	// Outcome is how it ended, and Err the error returned (nil when
	// acquired).
	Outcome AcquireOutcome
	Err     error
	// Wait is the time from the start of the call to its return.
	Wait time.Duration
	// Attempts is the number of attempts made on the backend (0 when the
	// input was rejected before any; a backend with a queue of its own
	// counts as one attempt however long it waited).
	Attempts int
	// Token and TTL are the fencing token and the granted TTL of the
	// lease, when acquired.
	Token backend.Token
	TTL   time.Duration
}

// RefreshEvent describes a refresh of a lease.
type RefreshEvent struct {
	Backend, Key string
	Token        backend.Token
	// Auto is true for a background refresh by the Locker's watchdog
	// (AcquireOptions.AutoRefresh), false for a call of Lease.Refresh.
	Auto bool
	// TTL is the lease time asked for, Granted what the server granted
	// (0 on failure).
	TTL, Granted time.Duration
	// Duration is how long the refresh took.
	Duration time.Duration
	// Err is nil on success. An error matching ErrNotHeld means the lease
	// is lost (its LeaseEnd follows); others leave the outcome unknown.
	Err error
}

// ReleaseOutcome is how a call of Lease.Release ended.
type ReleaseOutcome string

// The outcomes of a release.
const (
	// ReleaseReleased: the lock was given back.
	ReleaseReleased ReleaseOutcome = "released"
	// ReleaseNotHeld: the lease was no longer held (released before,
	// lost, or found gone on the server).
	ReleaseNotHeld ReleaseOutcome = "not_held"
	// ReleaseError: the backend failed; the lock may or may not be free.
	ReleaseError ReleaseOutcome = "error"
)

// ReleaseEvent describes a call of Lease.Release.
type ReleaseEvent struct {
	Backend, Key string
	Token        backend.Token
	Outcome      ReleaseOutcome
	// Err is the error Release returned.
	Err error
	// Duration is how long the call took.
	Duration time.Duration
}

// EndReason says why a lease ended.
type EndReason string

// The reasons a lease ends. All but EndReleased and EndClosed are losses
// (see EndReason.Lost).
const (
	// EndReleased: Lease.Release gave the lock back.
	EndReleased EndReason = "released"
	// EndClosed: its Locker was closed.
	EndClosed EndReason = "closed"
	// EndExpired: its deadline passed without a successful refresh.
	EndExpired EndReason = "expired"
	// EndNotHeld: a refresh or a release found the lock no longer ours.
	EndNotHeld EndReason = "not_held"
	// EndBackend: the backend reported the loss (a session that expired,
	// the lock key deleted by someone else).
	EndBackend EndReason = "backend"
	// EndReleaseFailed: a release failed with the outcome unknown; the
	// lock may be free, so the lease is no longer trusted.
	EndReleaseFailed EndReason = "release_failed"
)

// Lost reports whether the lease ended without Release or Close.
func (r EndReason) Lost() bool { return r != EndReleased && r != EndClosed }

// LeaseEndEvent describes the end of a lease.
type LeaseEndEvent struct {
	Backend, Key string
	Token        backend.Token
	Reason       EndReason
	// Err is the lease's Err.
	Err error
	// Held is the time from the grant's request to the end.
	Held time.Duration
}
