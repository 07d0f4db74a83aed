package dlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dlock-go/dlock/backend"
)

// The error vocabulary of dlock, defined once in package backend. Every error
// dlock returns wraps one of these; test with errors.Is. Errors from
// operations on a key are *[OpError] values that name the operation and the
// key.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or
	// Acquire ended before it got the lock; when its context ended, the
	// error matches ctx.Err() too.
	ErrNotAcquired = backend.ErrNotAcquired
	// ErrNotHeld: Release or Refresh of a lease that is no longer held
	// (released already, or lost). No other holder's lock was touched; a
	// lease lost to its own deadline still deletes its own key if it is
	// there, to free it for others.
	ErrNotHeld = backend.ErrNotHeld
	// ErrLeaseLost: the lease ended without Release; Lease.Err returns it
	// once Lease.Done is closed.
	ErrLeaseLost = backend.ErrLeaseLost
	// ErrClosed: the Locker was closed.
	ErrClosed = backend.ErrClosed
	// ErrInvalidKey: empty, longer than MaxKeyLen bytes, not UTF-8, with a
	// NUL byte, or a key the backend cannot represent. Returned before any
	// I/O.
	ErrInvalidKey = backend.ErrInvalidKey
	// ErrInvalidTTL: a TTL that is negative, below the backend's floor or
	// above its ceiling. Returned before any I/O.
	ErrInvalidTTL = backend.ErrInvalidTTL
	// ErrInvalidConfig: a bad option, URL or URL parameter. Returned before
	// any I/O.
	ErrInvalidConfig = backend.ErrInvalidConfig
	// ErrUnavailable: the backend could not be reached or could not give
	// the promised durability.
	ErrUnavailable = backend.ErrUnavailable
	// ErrUnsupported: the backend does not serve what was asked (shared
	// leases on Redlock: AcquireOptions.Permits or Shared). Returned
	// before any I/O.
	ErrUnsupported = backend.ErrUnsupported
)

// PermitsError is the cause of a semaphore acquire (AcquireOptions.Permits)
// whose number of permits differs from that of the key's holders; it
// matches ErrInvalidConfig.
type PermitsError = backend.PermitsError

// OpError is the error of an operation on a key. It wraps the cause, which
// matches one of the sentinel errors.
type OpError struct {
	// Op is the operation: "acquire", "try-acquire", "refresh", "release",
	// "inspect", "keys", "open" or "close".
	Op string
	// Key is the lock key ("" for operations on no key).
	Key string
	// Err is the cause.
	Err error
}

// Error returns, for example, `dlock: acquire "orders/42": lock not acquired: context deadline exceeded`.
// A key dlock accepts (at most MaxKeyLen bytes) is shown whole; a longer
// one, refused, by its first 64 bytes (cut on a character boundary) and
// its length: `dlock: try-acquire "aaaa…" (2000 bytes): invalid key: ...`.
func (e *OpError) Error() string {
	msg := strings.TrimPrefix(e.Err.Error(), "dlock: ")
	if e.Key == "" {
		return "dlock: " + e.Op + ": " + msg
	}
	return "dlock: " + e.Op + " " + quoteKey(e.Key) + ": " + msg
}

// maxKeyShown is how many bytes of a key longer than MaxKeyLen an error
// shows.
const maxKeyShown = 64

// quoteKey quotes key for an error: whole if dlock accepts its length (the
// caller may look for it, and the conformance suite checks that errors
// name it), else cut to maxKeyShown bytes with an ellipsis and its length,
// so that an error does not echo a key of any size.
func quoteKey(key string) string {
	if len(key) <= MaxKeyLen {
		return strconv.Quote(key)
	}
	cut := maxKeyShown
	for i := 0; i < utf8.UTFMax-1 && !utf8.RuneStart(key[cut]); i++ {
		cut-- // do not split a character
	}
	return strconv.Quote(key[:cut]+"…") + " (" + strconv.Itoa(len(key)) + " bytes)"
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

func opErr(op, key string, err error) error {
	return &OpError{Op: op, Key: key, Err: err}
}

// cancelled is the error of an acquire whose context ended: it matches
// ErrNotAcquired, ctx.Err() and, if different, the context's cause.
func cancelled(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && cause != err {
		return fmt.Errorf("%w: %w (%w)", ErrNotAcquired, err, cause)
	}
	return fmt.Errorf("%w: %w", ErrNotAcquired, err)
}
