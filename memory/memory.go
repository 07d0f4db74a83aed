// Package memory is an in-process dlock backend: the reference
// implementation of the driver interface, and a stand-in for a real backend
// in unit tests of code that takes a *dlock.Locker (as gocloud's memblob is
// for blobs).
//
// Lockers made on the same *Store exclude each other; a Store lives in this
// process only, so it is no distributed lock. Expiry runs on this process's
// monotonic clock, and tokens come from one counter per key that never goes
// back: within the process, fencing is exact.
//
// URL: "mem://" opens the process-wide default store; "mem://NAME" a named
// store, created on first use and shared by every Open of the same name. No
// parameters besides dlock's own (ttl). The package registers a [URLOpener]
// for the scheme on driver.DefaultURLMux, which dlock.Open uses; a
// URLOpener with a Store of your own (on a driver.URLMux of your own)
// opens its URLs on that store.
package memory

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
)

func init() {
	driver.DefaultURLMux().RegisterLocker("mem", &URLOpener{})
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// URLOpener opens mem:// URLs. The zero value opens them on the named
// stores shared by the process.
type URLOpener struct {
	// Store, if set, is the store every URL opens on; the URL's store name
	// is then ignored.
	Store *Store
	// Options configure the Lockers opened (Logger, TTL, ...); the URL's
	// ttl overrides Options.TTL.
	Options dlock.Options
}

// OpenLockerURL opens a Locker for u (see the package documentation).
func (o *URLOpener) OpenLockerURL(_ context.Context, u *url.URL) (*dlock.Locker, error) {
	return driver.OpenURL(u, &o.Options, backend.Limits{}, func(rest *url.URL, _ *dlock.Options) (func() (backend.Driver, error), error) {
		if rest.RawQuery != "" {
			return nil, fmt.Errorf("%w: mem:// takes no parameters but ttl, got %q", backend.ErrInvalidConfig, rest.RawQuery)
		}
		if u.Path != "" && u.Path != "/" || u.User != nil || u.Port() != "" {
			return nil, fmt.Errorf("%w: mem:// takes a store name only, as in mem://NAME", backend.ErrInvalidConfig)
		}
		s := o.Store
		if s == nil {
			namedMu.Lock()
			s = named[u.Host]
			if s == nil {
				s = NewStore()
				named[u.Host] = s
			}
			namedMu.Unlock()
		}
		return func() (backend.Driver, error) { return NewDriver(s), nil }, nil
	})
}

// Guarantees declares, before any I/O, what every Locker the opener
// opens promises: exact fencing within the process (driver.GuaranteesDeclarer).
func (o *URLOpener) Guarantees() dlock.Guarantees {
	return dlock.Guarantees{Fencing: dlock.FencingConsensus, Shared: true}
}

// Store holds the locks. Its zero value is not usable; call NewStore.
type Store struct {
	mu     sync.Mutex
	locks  map[string]*entry
	tokens map[string]uint64
	// reserved: until then, an exclusive waiter that found the key held
	// by shared grants keeps new shared requests out
	// (backend.Request.Wait), even once the key is free, so that a
	// reader cannot slip in between the last reader's release and the
	// writer's next attempt.
	reserved map[string]time.Time
	watchers map[string]map[chan struct{}]struct{}
}

// entry is the state of one held key: one exclusive grant, or shared
// grants of one Permits.
type entry struct {
	grants  []*grant // oldest first
	shared  bool
	permits int
}

type grant struct {
	token   uint64
	holder  string // backend.Request.Holder
	expires time.Time
	reason  error       // why it was dropped, other than by Release
	onLost  func(error) // the holder's loss callback (NotifyLoss)
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		locks:    map[string]*entry{},
		tokens:   map[string]uint64{},
		reserved: map[string]time.Time{},
		watchers: map[string]map[chan struct{}]struct{}{},
	}
}

// New returns a Locker on s. Lockers on one store contend for the same keys.
// Bad opts are an error matching dlock.ErrInvalidConfig or
// dlock.ErrInvalidTTL.
func New(s *Store, opts *dlock.Options) (*dlock.Locker, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: memory: nil Store", backend.ErrInvalidConfig)
	}
	return driver.New(NewDriver(s), opts)
}

// Expire drops every lease on key at once (all of a semaphore's permits),
// as if their TTLs had run out, and reports whether one was held. The
// holders' leases learn of it (their Done fires). For tests of lease loss.
func (s *Store) Expire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.current(key, time.Now())
	if e == nil {
		return false
	}
	for _, g := range slices.Clone(e.grants) { // drop changes e.grants
		s.drop(key, g, fmt.Errorf("%w: expired by Store.Expire", backend.ErrLeaseLost))
	}
	return true
}

// Held reports whether a lease on key is held now.
func (s *Store) Held(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current(key, time.Now()) != nil
}

// Waiters reports how many watches on key are in force (waiting Acquires).
func (s *Store) Waiters(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers[key])
}

// current returns key's entry with its live grants, dropping expired ones,
// or nil when none is left. s.mu is held.
func (s *Store) current(key string, now time.Time) *entry {
	e := s.locks[key]
	if e == nil {
		return nil
	}
	for _, g := range slices.Clone(e.grants) { // drop changes e.grants
		if !now.Before(g.expires) {
			s.drop(key, g, fmt.Errorf("%w: TTL ran out", backend.ErrLeaseLost))
		}
	}
	return s.locks[key]
}

// drop removes g, tells its holder why (a nil reason: released), and wakes
// the watchers of key. s.mu is held.
func (s *Store) drop(key string, g *grant, reason error) {
	e := s.locks[key]
	if e == nil {
		return
	}
	for i, x := range e.grants {
		if x == g {
			e.grants = append(e.grants[:i], e.grants[i+1:]...)
			break
		}
	}
	if len(e.grants) == 0 {
		delete(s.locks, key)
	}
	if reason != nil {
		g.reason = reason
		if g.onLost != nil {
			go g.onLost(reason) // not under s.mu
		}
	}
	for ch := range s.watchers[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// mine reports whether g is a live grant on key. s.mu is held.
func (s *Store) mine(key string, g *grant, now time.Time) bool {
	e := s.current(key, now)
	return e != nil && slices.Contains(e.grants, g)
}

// Driver is the backend.Driver of a Store.
type Driver struct{ s *Store }

// NewDriver returns a driver on s.
func NewDriver(s *Store) *Driver { return &Driver{s: s} }

// ValidateKey accepts every key dlock accepts.
func (d *Driver) ValidateKey(string) error { return nil }

// Limits: any TTL of a millisecond or more.
func (d *Driver) Limits() backend.Limits { return backend.Limits{MinTTL: time.Millisecond} }

// Guarantees: exact fencing within one process; no fault tolerance (there
// is nothing to fail but the process); no FIFO order; no clock assumptions
// (one monotonic clock serves holder and store). Shared leases are served
// (semaphores and read-write locks, see backend.Request).
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Backend: "memory",
		Fencing: backend.FencingConsensus,
		Shared:  true,
		Notes:   "in-process only: locks are shared by Lockers on one Store, never between processes",
	}
}

// Close does nothing: the store lives on for other drivers.
func (d *Driver) Close() error { return nil }

// TryAcquire implements backend.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	key, ttl := req.Key, req.TTL
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	e := s.current(key, now)
	reserved := s.reserved[key]
	if !now.Before(reserved) {
		delete(s.reserved, key)
	}
	if e != nil {
		if req.Shared && e.shared && e.permits != req.Permits {
			return nil, &backend.PermitsError{Asked: req.Permits, Held: e.permits}
		}
		full := !req.Shared || !e.shared ||
			e.permits > 0 && len(e.grants) >= e.permits ||
			now.Before(reserved) // a writer waits: readers stay out
		if full {
			if !req.Shared && e.shared && req.Wait > 0 {
				s.reserved[key] = now.Add(req.Wait)
			}
			return nil, &backend.HeldError{RetryAfter: e.retryAfter(now)}
		}
	} else {
		if req.Shared && now.Before(reserved) {
			// Free, but kept for the writer that waited for its readers.
			return nil, &backend.HeldError{RetryAfter: reserved.Sub(now)}
		}
		e = &entry{shared: req.Shared, permits: req.Permits}
		s.locks[key] = e
	}
	if !req.Shared {
		delete(s.reserved, key)
	}
	s.tokens[key]++
	g := &grant{token: s.tokens[key], holder: req.Holder, expires: now.Add(ttl)}
	e.grants = append(e.grants, g)
	return &lease{s: s, key: key, g: g, ttl: ttl}, nil
}

// retryAfter bounds how long the key stays as full as it is now: until
// the first of its grants expires. e has live grants.
func (e *entry) retryAfter(now time.Time) time.Duration {
	first := e.grants[0].expires
	for _, g := range e.grants[1:] {
		if g.expires.Before(first) {
			first = g.expires
		}
	}
	return first.Sub(now)
}

// Watch implements backend.Waiter.
func (d *Driver) Watch(_ context.Context, key string) (<-chan struct{}, func(), error) {
	s := d.s
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.watchers[key] == nil {
		s.watchers[key] = map[chan struct{}]struct{}{}
	}
	s.watchers[key][ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.watchers[key], ch)
		if len(s.watchers[key]) == 0 {
			delete(s.watchers, key)
		}
		s.mu.Unlock()
	}, nil
}

type lease struct {
	s   *Store
	key string
	g   *grant
	ttl time.Duration
}

func (l *lease) Token() uint64      { return l.g.token }
func (l *lease) TTL() time.Duration { return l.ttl }

// ours reports whether l's grant is live. s.mu is held.
func (l *lease) ours(now time.Time) bool { return l.s.mine(l.key, l.g, now) }

func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	now := time.Now()
	if !l.ours(now) {
		return 0, fmt.Errorf("%w: the lock is gone or has another holder", backend.ErrNotHeld)
	}
	l.g.expires = now.Add(ttl)
	l.ttl = ttl
	return ttl, nil
}

func (l *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.ours(time.Now()) {
		return fmt.Errorf("%w: the lock is gone or has another holder", backend.ErrNotHeld)
	}
	l.s.drop(l.key, l.g, nil)
	return nil
}

// NotifyLoss implements backend.LossNotifier: f is called when the store
// drops the grant other than by Release (Expire, or the TTL ran out and
// someone looked).
func (l *lease) NotifyLoss(f func(error)) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.g.reason != nil {
		go f(l.g.reason)
		return
	}
	l.g.onLost = f
}

// Inspect implements backend.Inspector. It changes nothing (expired
// grants are left out, not dropped). Waiters is -1: the store keeps no
// queue, only one watch per waiting Locker.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if err := ctx.Err(); err != nil {
		return backend.LockInfo{}, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	info := backend.LockInfo{Waiters: -1}
	e := s.locks[key]
	if e == nil {
		return info, nil
	}
	for _, g := range e.grants {
		if left := time.Until(g.expires); left > 0 {
			info.Holders = append(info.Holders, backend.Holding{Token: backend.Token(g.token), TTL: left, Holder: g.holder})
		}
	}
	if len(info.Holders) == 0 {
		return info, nil
	}
	h := info.Holders[0]
	info.Held, info.Token, info.TTL, info.Holder = true, h.Token, h.TTL, h.Holder
	info.Shared, info.Permits = e.shared, e.permits
	return info, nil
}

// Keys implements backend.Inspector: the keys of the store that are held.
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", backend.ErrUnavailable, err)
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var keys []string
	for k, e := range s.locks {
		if len(keys) == limit {
			break
		}
		if slices.ContainsFunc(e.grants, func(g *grant) bool { return now.Before(g.expires) }) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}
