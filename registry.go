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

// urlMux maps URL schemes to the functions that open them: the mux behind
// [Open] and [Config.Open], and behind package driver's URLMux (which
// reaches it through internal/hook, as its methods say). Its zero value is
// an empty mux, ready to use. It is safe for concurrent use.
type urlMux struct {
	mu      sync.RWMutex
	openers map[string]urlOpener
}

// urlOpener is what a urlMux keeps for a scheme.
type urlOpener struct {
	// open opens a Locker for a URL, without the parameters the mux owns.
	open func(context.Context, *url.URL) (*Locker, error)
	// declared, if not nil, reports what every Locker open opens promises
	// at best (driver.GuaranteesDeclarer), so that the mux refuses a
	// purpose the backend cannot serve before any I/O.
	declared func() Guarantees
}

// defaultMux is the mux of Open and Config.Open, where backend packages
// register their schemes (driver.DefaultURLMux).
var defaultMux = new(urlMux)

// Register makes open open the URLs of scheme (case-insensitive); declared
// may be nil. It panics if the scheme is empty or registered already
// (driver.URLMux.RegisterLocker checks the opener).
func (m *urlMux) Register(scheme string, open func(context.Context, *url.URL) (*Locker, error), declared func() Guarantees) {
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		panic("dlock: RegisterLocker with an empty scheme")
	}
	if open == nil {
		panic("dlock: RegisterLocker opener is nil for scheme " + scheme)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.openers[scheme]; dup {
		panic("dlock: RegisterLocker called twice for scheme " + scheme)
	}
	if m.openers == nil {
		m.openers = map[string]urlOpener{}
	}
	m.openers[scheme] = urlOpener{open: open, declared: declared}
}

// ValidScheme reports whether scheme (case-insensitive) is registered.
func (m *urlMux) ValidScheme(scheme string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.openers[strings.ToLower(scheme)]
	return ok
}

// Schemes returns the registered URL schemes, sorted.
func (m *urlMux) Schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := make([]string, 0, len(m.openers))
	for k := range m.openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Open parses rawURL and opens it with OpenURL.
func (m *urlMux) Open(ctx context.Context, rawURL string) (*Locker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// Not err itself: a url.Error quotes the whole URL, and its inner
		// error part of it (`invalid port ":S3cr" after host` for a
		// password holding a '/'), password included.
		return nil, opErr("open", "", fmt.Errorf("%w: %s that does not parse (%s); its text is not shown, as it may hold a password",
			ErrInvalidConfig, urlScheme(rawURL), urlProblem(err)))
	}
	if atAfterHost(u, rawURL) {
		// It parsed, but not as meant: "redis://app:2024/S3cret@host"
		// has host "app:2024" and the password in its path, which the
		// errors of the backend (and url.URL.Redacted) would show.
		return nil, opErr("open", "", fmt.Errorf("%w: %s with an '@' after its host and no user: a '/', '?' or '#' in a password must be %%-escaped "+
			"(an '@' elsewhere as %%40); its text is not shown, as it may hold a password", ErrInvalidConfig, urlScheme(rawURL)))
	}
	return m.OpenURL(ctx, u)
}

// atAfterHost reports whether rawURL, parsed as u, has no user information
// but an '@' after its host (in its path, query or fragment): most likely
// a password holding a '/', '?' or '#' that was not %-escaped, which
// url.Parse takes for the end of the host (url.URL.Redacted would show
// it). cmd/dlock has a copy, to print such a URL by
// its scheme only.
func atAfterHost(u *url.URL, rawURL string) bool {
	if u.User != nil {
		return false
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}

// urlScheme names the scheme of rawURL, a URL that does not parse (or
// that atAfterHost refuses), without
// the rest of its text: `a "redis" URL`, or "a URL without a valid scheme"
// if it does not begin with one (RFC 3986: a letter, then letters, digits,
// '+', '-' or '.') followed by "://".
func urlScheme(rawURL string) string {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || scheme == "" || !isSchemeLetter(scheme[0]) {
		return "a URL without a valid scheme"
	}
	for i := 1; i < len(scheme); i++ {
		c := scheme[i]
		if !isSchemeLetter(c) && !('0' <= c && c <= '9') && c != '+' && c != '-' && c != '.' {
			return "a URL without a valid scheme"
		}
	}
	return fmt.Sprintf("a %q URL", strings.ToLower(scheme))
}

func isSchemeLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// urlProblem is the kind of problem url.Parse found, in words of our own:
// its errors quote the text around the problem, which may be a password.
func urlProblem(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var escErr url.EscapeError
	var hostErr url.InvalidHostError
	switch msg := err.Error(); {
	case errors.As(err, &escErr):
		return "a malformed %-escape"
	case errors.As(err, &hostErr):
		return "a character not allowed in a host name"
	case strings.HasPrefix(msg, "invalid port "):
		return "a port that is not a number: a '/', '?' or '#' in a password must be %-escaped"
	case strings.Contains(msg, "invalid userinfo"):
		return "a character not allowed in the user name or password: %-escape it"
	case strings.Contains(msg, "control character"):
		return "a control character"
	case strings.Contains(msg, "missing protocol scheme"):
		return "no scheme"
	case strings.Contains(msg, "cannot contain colon"):
		return "a colon before any '/'"
	case strings.Contains(msg, "IP-literal"), strings.Contains(msg, "missing ']'"):
		return "a malformed IPv6 address"
	}
	return "malformed"
}

// OpenURL returns a Locker for u, opened by the function registered for
// its scheme, after taking out the parameters the mux owns (purpose and
// unsafe_accept_clock_dependent_lock; see Open and driver.URLMux's
// OpenLockerURL).
func (m *urlMux) OpenURL(ctx context.Context, u *url.URL) (*Locker, error) {
	if u == nil {
		return nil, opErr("open", "", fmt.Errorf("%w: nil URL", ErrInvalidConfig))
	}
	m.mu.RLock()
	opener, ok := m.openers[strings.ToLower(u.Scheme)]
	m.mu.RUnlock()
	if !ok {
		return nil, opErr("open", "", fmt.Errorf("%w: unknown scheme %q in %s (registered: %s; forgotten import?)",
			ErrInvalidConfig, u.Scheme, u.Redacted(), strings.Join(m.Schemes(), ", ")))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, opErr("open", "", fmt.Errorf("%w: query of %s: %w", ErrInvalidConfig, u.Redacted(), err))
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
	if opener.declared != nil && !override {
		if err := purpose.check(opener.declared()); err != nil {
			return nil, opErr("open", "", err) // before any I/O
		}
	}
	rest := *u
	rest.RawQuery = q.Encode()
	l, err := opener.open(ctx, &rest)
	if err != nil {
		var oe *OpError
		if errors.As(err, &oe) && oe.Op == "open" {
			return nil, err
		}
		return nil, opErr("open", "", err)
	}
	if l == nil {
		return nil, opErr("open", "", fmt.Errorf("%w: the opener of scheme %q returned no Locker", ErrInvalidConfig, u.Scheme))
	}
	if err := purpose.check(l.Guarantees()); err != nil {
		if !override {
			_ = l.Close()
			return nil, opErr("open", "", err)
		}
		l.log.Warn("dlock: opened a lock for correctness on a backend that cannot guarantee it, as "+unsafeOverrideParam+"=true asks",
			"scheme", u.Scheme, "reason", err)
	}
	return l, nil
}

// Open returns a Locker for a URL such as "redis://localhost:6379?ttl=10s"
// or "mem://". The scheme picks the backend, which must be registered (by
// importing its package, with the blank identifier if need be: redis,
// rediss, redlock, redlocks, etcd, etcds, zk, zks, mem). Parameters every
// backend accepts:
//
//	ttl      default lease TTL (Options.TTL), a Go duration such as 10s
//	purpose  efficiency (the default) or correctness: what the lock is
//	         for. Opening a backend for correctness fails unless its
//	         Guarantees report consensus fencing and no clock dependence
//	         (etcd, ZooKeeper); see [Purpose]. A backend that declares its
//	         Guarantees is refused before any I/O.
//	unsafe_accept_clock_dependent_lock
//	         true opens a lock for correctness on a backend that cannot
//	         serve it (logged as a warning by the Locker's Logger), for
//	         those who accept the risk
//
// Each backend documents its own parameters; an unknown one is an error
// matching ErrInvalidConfig, as is an unknown scheme or a malformed URL.
// Errors are *OpError values (Op "open") wrapping the cause. To use a client
// of your own, call the backend's constructor (redis.New, etcd.New, ...).
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	return defaultMux.Open(ctx, rawURL)
}

// optionsFromURL takes the Locker's parameters out of u's query and
// applies them to a copy of base (nil: all defaults), checked as newLocker
// checks Options (the TTL against dlock's floor only). It returns the
// Options and u without those parameters, for the backend to parse the
// rest; it does no I/O. Every backend's URL opener calls it (package
// driver's OptionsFromURL), so the URL
// parameters and the Options fields share one validation. The parameter:
//
//	ttl  default lease TTL (Options.TTL), a Go duration such as 10s
//
// Errors wrap ErrInvalidConfig (a malformed query, a repeated or empty
// parameter, a bad value) or ErrInvalidTTL (a bad base TTL).
func optionsFromURL(u *url.URL, base *Options) (*Options, *url.URL, error) {
	var o Options
	if base != nil {
		o = *base
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: query of %s: %w", ErrInvalidConfig, u.Redacted(), err)
	}
	if v, ok := q["ttl"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < minTTL || len(v) > 1 {
			return nil, nil, fmt.Errorf("%w: parameter ttl=%q: want one duration of at least %v, such as 10s", ErrInvalidConfig, v[0], minTTL)
		}
		o.TTL = d
		q.Del("ttl")
	}
	if err := o.check(Limits{}); err != nil {
		return nil, nil, err
	}
	rest := *u
	rest.RawQuery = q.Encode()
	return &o, &rest, nil
}

// build is how a backend's constructor makes a Locker (package driver's
// Build), so that bad Options are an error before any I/O: it checks opts
// as newLocker does, with the TTL against lim (the backend's limits known
// without asking its servers), then calls newDriver and wraps the driver
// with newLocker. If newLocker refuses the
// Options on the limits the driver reports (learned from the servers), the
// driver is closed and newLocker's error returned. newDriver's error is returned
// as it is.
func build(opts *Options, lim Limits, newDriver func() (backend.Driver, error)) (*Locker, error) {
	if opts != nil {
		if err := opts.check(lim); err != nil {
			return nil, err
		}
	}
	d, err := newDriver()
	if err != nil {
		return nil, err
	}
	l, err := newLocker(d, opts)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}
