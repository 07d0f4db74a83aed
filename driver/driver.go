// Package driver is for backend authors and tools, not for users of dlock:
// users call dlock.Open (or dlock.Config.Open) with a URL, or a backend's
// own constructor (redis.New, etcd.New, zookeeper.New, redlock.New,
// memory.New) with a client they already have.
//
// A backend implements the interfaces of package backend and turns its
// driver into a *dlock.Locker with [Build] (or [New]), so that the Locker
// owns what must behave the same everywhere. To be opened by URL it
// registers a [URLOpener] on [DefaultURLMux] from its init; its
// OpenLockerURL shares one body, [OpenURL], with every other backend's.
// [DriverOf], [LeaseOf], [LockerAs] and [LeaseAs] reach the backend behind
// a Locker or a Lease, for the conformance suite, diagnostics and backend
// functions such as etcd.OwnerOf.
package driver

import (
	"context"
	"net/url"
	"reflect"
	"strings"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/hook"
)

// dlock's unexported functions (see internal/hook), set by its init, which
// runs before this package's initialization.
var (
	newLocker      = hook.NewLocker.(func(backend.Driver, *dlock.Options) (*dlock.Locker, error))
	build          = hook.Build.(func(*dlock.Options, dlock.Limits, func() (backend.Driver, error)) (*dlock.Locker, error))
	optionsFromURL = hook.OptionsFromURL.(func(*url.URL, *dlock.Options) (*dlock.Options, *url.URL, error))
	driverOf       = hook.DriverOf.(func(*dlock.Locker) backend.Driver)
	leaseOf        = hook.LeaseOf.(func(*dlock.Lease) backend.Lease)
	keys           = hook.Keys.(func(*dlock.Locker, context.Context, int) ([]string, error))
	newMux         = hook.NewMux.(func() any)
	defaultURLMux  = &URLMux{m: hook.DefaultMux.(mux)}
)

// New returns a Locker over the backend driver d. Backend packages offer
// constructors that call it or [Build] (for example redis.New); use New
// directly only to wrap a driver of your own. Zero fields of opts take
// their defaults; a field out of range (a negative duration, DriftFactor of
// 0.5 or more, RetryMax below RetryMin, a TTL outside the backend's limits)
// is an error matching dlock.ErrInvalidConfig or dlock.ErrInvalidTTL, and
// New then returns no Locker (d stays open: it is the caller's to close).
func New(d backend.Driver, opts *dlock.Options) (*dlock.Locker, error) {
	return newLocker(d, opts)
}

// Build is how a backend's constructor makes a Locker, so that bad Options
// are an error before any I/O: it checks opts as [New] does, with the TTL
// against lim (the backend's limits known without asking its servers),
// then calls newDriver and wraps the driver with New. If New refuses the
// Options on the limits the driver reports (learned from the servers), the
// driver is closed and New's error returned. newDriver's error is returned
// as it is.
func Build(opts *dlock.Options, lim dlock.Limits, newDriver func() (backend.Driver, error)) (*dlock.Locker, error) {
	return build(opts, lim, newDriver)
}

// OptionsFromURL takes the Locker's parameters out of u's query and
// applies them to a copy of base (nil: all defaults), checked as [New]
// checks Options (the TTL against dlock's floor only). It returns the
// Options and u without those parameters, for the backend to parse the
// rest; it does no I/O. [OpenURL] calls it, so the URL parameters and the
// Options fields share one validation. The parameter:
//
//	ttl  default lease TTL (Options.TTL), a Go duration such as 10s
//
// Errors wrap dlock.ErrInvalidConfig (a malformed query, a repeated or
// empty parameter, a bad value) or dlock.ErrInvalidTTL (a bad base TTL).
func OptionsFromURL(u *url.URL, base *dlock.Options) (*dlock.Options, *url.URL, error) {
	return optionsFromURL(u, base)
}

// OpenURL is the body every backend's [URLOpener.OpenLockerURL] shares. It
// takes the Locker's parameters out of u with [OptionsFromURL] (base: the
// opener's Locker Options), then calls parse with the rest of the URL and
// the Locker's Options: parse reads the backend's own parameters, without
// I/O, and returns the function that makes the driver (which may parse
// and dial, and then owns what it dials). OpenURL then makes the Locker
// with [Build], checking the Options against lim before any I/O.
func OpenURL(u *url.URL, base *dlock.Options, lim dlock.Limits,
	parse func(rest *url.URL, lo *dlock.Options) (newDriver func() (backend.Driver, error), err error)) (*dlock.Locker, error) {
	lo, rest, err := OptionsFromURL(u, base)
	if err != nil {
		return nil, err
	}
	newDriver, err := parse(rest, lo)
	if err != nil {
		return nil, err
	}
	return Build(lo, lim, newDriver)
}

// DriverOf returns the backend driver behind l (nil for a nil l), for the
// conformance suite, diagnostics and backend functions. Calls on it bypass
// the Locker's bookkeeping.
func DriverOf(l *dlock.Locker) backend.Driver {
	if l == nil {
		return nil
	}
	return driverOf(l)
}

// LeaseOf returns the driver's lease behind le (nil for a nil le), for the
// conformance suite, diagnostics and backend functions (etcd.OwnerOf).
// Calls on it bypass le's bookkeeping (deadline, Done, the watchdog), so a
// program should not refresh or release through it.
func LeaseOf(le *dlock.Lease) backend.Lease {
	if le == nil {
		return nil
	}
	return leaseOf(le)
}

// LockerAs lets a caller reach the backend's own types behind l: it sets
// *target and reports true when l's driver has a method As(any) bool that
// supports the target's type (each backend documents which, for example a
// *goredis.UniversalClient for redis, a **zk.Conn for zookeeper). It
// reports false otherwise, and for a nil l or target (or a nil pointer).
// The driver itself is not a target: a *backend.Driver gets false; use
// [DriverOf].
func LockerAs(l *dlock.Locker, target any) bool {
	if l == nil || isNil(target) {
		return false
	}
	if a, ok := driverOf(l).(interface{ As(any) bool }); ok {
		return a.As(target)
	}
	return false
}

// LeaseAs lets a caller reach the backend's own view of le: it sets
// *target and reports true when the driver's lease has a method As(any)
// bool that supports the target's type (each backend documents which; etcd
// supports *etcd.Ownership, also given by etcd.OwnerOf). It reports false
// otherwise, and for a nil le or target (or a nil pointer). The driver's
// lease itself is not a target: a *backend.Lease gets false; use [LeaseOf].
func LeaseAs(le *dlock.Lease, target any) bool {
	if le == nil || isNil(target) {
		return false
	}
	if a, ok := leaseOf(le).(interface{ As(any) bool }); ok {
		return a.As(target)
	}
	return false
}

// Keys lists up to limit keys that have a holder or a queued waiter on l's
// backend, under l's prefix (or namespace) only, in no particular order;
// an empty list means the key space is empty. It is for tools (the
// `dlock compare` command) and the conformance suite; like
// dlock.Locker.Inspect it changes nothing. A limit ≤ 0 is an error
// matching dlock.ErrInvalidConfig, and a backend that cannot list its keys
// (one that is no backend.Inspector) one matching errors.ErrUnsupported
// and dlock.ErrInvalidConfig, both before any I/O. Errors are
// *dlock.OpError values with Op "keys".
func Keys(ctx context.Context, l *dlock.Locker, limit int) ([]string, error) {
	return keys(l, ctx, limit)
}

// isNil reports whether an As target is nil or a nil pointer, which As
// cannot set.
func isNil(target any) bool {
	if target == nil {
		return true
	}
	v := reflect.ValueOf(target)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// URLOpener opens a Locker from a URL. Each backend package has one (for
// example redis.URLOpener), which its init registers on [DefaultURLMux];
// a program that wants its own client, Logger or Options with a URL
// registers its own on a [URLMux] of its own.
//
// The URL an opener receives from a URLMux no longer holds the parameters
// the mux owns (purpose, unsafe_accept_clock_dependent_lock). The opener
// takes the Locker's parameters (ttl) with [OptionsFromURL] ([OpenURL] does
// it all), and must reject any parameter left that it does not know, with
// an error wrapping dlock.ErrInvalidConfig, before any I/O.
type URLOpener interface {
	OpenLockerURL(ctx context.Context, u *url.URL) (*dlock.Locker, error)
}

// GuaranteesDeclarer is an optional interface of a [URLOpener]: Guarantees
// reports what every Locker it opens promises at best (its fencing grade
// and whether it depends on clocks), so that a URLMux refuses a purpose the
// backend cannot serve before any I/O. Without it the mux checks the
// Locker's Guarantees after opening.
type GuaranteesDeclarer interface {
	Guarantees() dlock.Guarantees
}

// mux is dlock's unexported mux type, seen through its methods.
type mux interface {
	Register(scheme string, open func(context.Context, *url.URL) (*dlock.Locker, error), declared func() dlock.Guarantees)
	ValidScheme(scheme string) bool
	Schemes() []string
	Open(ctx context.Context, rawURL string) (*dlock.Locker, error)
	OpenURL(ctx context.Context, u *url.URL) (*dlock.Locker, error)
}

// URLMux maps URL schemes to URLOpeners. Its zero value is an empty mux,
// ready to use. It is safe for concurrent use.
type URLMux struct {
	once sync.Once
	m    mux
}

// mux returns m's mux, made on first use.
func (m *URLMux) mux() mux {
	m.once.Do(func() {
		if m.m == nil {
			m.m = newMux().(mux)
		}
	})
	return m.m
}

// DefaultURLMux returns the URLMux that dlock.Open and dlock.Config.Open
// use. Backend packages register their schemes on it from init, so
// importing one (for its side effect, with the blank identifier if need
// be) is enough.
func DefaultURLMux() *URLMux { return defaultURLMux }

// RegisterLocker makes opener open the URLs of scheme (case-insensitive).
// It panics if opener is nil, the scheme is empty, or the scheme is
// registered already.
func (m *URLMux) RegisterLocker(scheme string, opener URLOpener) {
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		panic("dlock: RegisterLocker with an empty scheme")
	}
	if opener == nil || isNil(opener) {
		panic("dlock: RegisterLocker opener is nil for scheme " + scheme)
	}
	var declared func() dlock.Guarantees
	if d, ok := opener.(GuaranteesDeclarer); ok {
		declared = d.Guarantees
	}
	m.mux().Register(scheme, opener.OpenLockerURL, declared)
}

// ValidLockerScheme reports whether scheme (case-insensitive) is
// registered.
func (m *URLMux) ValidLockerScheme(scheme string) bool { return m.mux().ValidScheme(scheme) }

// LockerSchemes returns the registered URL schemes, sorted.
func (m *URLMux) LockerSchemes() []string { return m.mux().Schemes() }

// OpenLocker parses rawURL and opens it with [URLMux.OpenLockerURL]. A URL
// that does not parse is reported without its text, which may hold a
// password.
func (m *URLMux) OpenLocker(ctx context.Context, rawURL string) (*dlock.Locker, error) {
	return m.mux().Open(ctx, rawURL)
}

// OpenLockerURL returns a Locker for u, opened by the URLOpener registered
// for its scheme. The mux takes out the parameters it owns:
//
//	purpose  efficiency (the default) or correctness: what the lock is
//	         for. Opening a backend for correctness fails unless its
//	         Guarantees report consensus fencing and no clock dependence
//	         (etcd, ZooKeeper); see dlock.Purpose. An opener that declares
//	         its Guarantees ([GuaranteesDeclarer]) is refused before any
//	         I/O.
//	unsafe_accept_clock_dependent_lock
//	         true opens it anyway (logged as a warning by the Locker's
//	         Logger), for those who accept the risk
//
// and hands the rest to the opener. Errors are *dlock.OpError values (Op
// "open") wrapping the cause; an unknown scheme or a malformed URL matches
// dlock.ErrInvalidConfig.
func (m *URLMux) OpenLockerURL(ctx context.Context, u *url.URL) (*dlock.Locker, error) {
	return m.mux().OpenURL(ctx, u)
}
