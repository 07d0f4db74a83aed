package dlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// Opener builds a backend driver from a URL. Package dlock has already taken
// out the parameters every backend shares (ttl); the opener must reject any
// parameter left that it does not know, with an error wrapping
// ErrInvalidConfig, before any I/O.
type Opener func(ctx context.Context, u *url.URL) (backend.Driver, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Opener{}
)

// Register makes a backend available to Open under a URL scheme. Backend
// packages call it from init, so importing one (for its side effect, with
// the blank identifier if need be) is enough. Register panics if open is nil
// or the scheme is registered already.
func Register(scheme string, open Opener) {
	scheme = strings.ToLower(scheme)
	if open == nil {
		panic("dlock: Register opener is nil for scheme " + scheme)
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic("dlock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

var (
	declaredMu sync.RWMutex
	declared   = map[string]Guarantees{}
)

// RegisterGuarantees records what every Locker opened from scheme promises
// at best (its fencing grade and whether it depends on clocks), so that
// [Open] can refuse a purpose the backend cannot serve before any I/O.
// Backend packages call it from init, next to [Register]; without it Open
// checks the Locker's Guarantees after opening.
func RegisterGuarantees(scheme string, g Guarantees) {
	declaredMu.Lock()
	defer declaredMu.Unlock()
	declared[strings.ToLower(scheme)] = g
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Open returns a Locker for a URL such as "redis://localhost:6379?ttl=10s"
// or "mem://". The scheme picks the backend, which must be registered (by
// importing its package). Parameters every backend accepts:
//
//	ttl      default lease TTL (Options.TTL), a Go duration such as 10s
//	purpose  efficiency (the default) or correctness: what the lock is
//	         for. Opening a backend for correctness fails unless its
//	         Guarantees report consensus fencing and no clock dependence
//	         (etcd, ZooKeeper); see [Purpose].
//	unsafe_accept_clock_dependent_lock
//	         true opens it anyway (logged as a warning), for those who
//	         accept the risk
//
// Each backend documents its own parameters; an unknown one is an error
// matching ErrInvalidConfig, as is an unknown scheme.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// A url.Error quotes the whole URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, opErr("open", "", fmt.Errorf("%w: bad URL: %w", ErrInvalidConfig, err))
	}
	registryMu.RLock()
	open, ok := registry[strings.ToLower(u.Scheme)]
	registryMu.RUnlock()
	if !ok {
		return nil, opErr("open", "", fmt.Errorf("%w: unknown scheme %q in %s (registered: %s; forgotten import?)",
			ErrInvalidConfig, u.Scheme, u.Redacted(), strings.Join(Schemes(), ", ")))
	}
	q := u.Query()
	var opts Options
	if v, ok := q["ttl"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < MinTTL || len(v) > 1 {
			return nil, opErr("open", "", fmt.Errorf("%w: parameter ttl=%q: want one duration of at least %v, such as 10s", ErrInvalidConfig, v[0], MinTTL))
		}
		opts.TTL = d
		q.Del("ttl")
	}
	purpose := Efficiency
	if v, ok := q["purpose"]; ok {
		purpose = Purpose(v[0])
		if (purpose != Efficiency && purpose != Correctness) || len(v) > 1 {
			return nil, opErr("open", "", fmt.Errorf("%w: parameter purpose=%q: want %q or %q", ErrInvalidConfig, v[0], Efficiency, Correctness))
		}
		q.Del("purpose")
	}
	override := false
	if v, ok := q[unsafeOverrideParam]; ok {
		if len(v) > 1 || (v[0] != "true" && v[0] != "false") {
			return nil, opErr("open", "", fmt.Errorf("%w: parameter %s=%q: want true or false", ErrInvalidConfig, unsafeOverrideParam, v[0]))
		}
		override = v[0] == "true"
		q.Del(unsafeOverrideParam)
	}
	declaredMu.RLock()
	g, known := declared[strings.ToLower(u.Scheme)]
	declaredMu.RUnlock()
	if known && !override {
		if err := purpose.Check(g); err != nil {
			return nil, opErr("open", "", err) // before any I/O
		}
	}
	rest := *u
	rest.RawQuery = q.Encode()
	d, err := open(ctx, &rest)
	if err != nil {
		return nil, opErr("open", "", err)
	}
	l := New(d, &opts)
	if l.cfgErr != nil {
		_ = d.Close()
		return nil, opErr("open", "", l.cfgErr)
	}
	if err := purpose.Check(l.Guarantees()); err != nil {
		if !override {
			_ = d.Close()
			return nil, opErr("open", "", err)
		}
		l.log.Warn("dlock: opened a lock for correctness on a backend that cannot guarantee it, as "+unsafeOverrideParam+"=true asks",
			"scheme", u.Scheme, "reason", err)
	}
	return l, nil
}
