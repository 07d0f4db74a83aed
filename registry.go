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

// URLOpener opens a Locker from a URL. Each backend package has one (for
// example redis.URLOpener), which its init registers on [DefaultURLMux];
// a program that wants its own client, Logger or Options registers its own
// on a [URLMux] of its own.
//
// The URL an opener receives from a URLMux no longer holds the parameters
// the mux owns (purpose, unsafe_accept_clock_dependent_lock). The opener
// takes the Locker's parameters (ttl) with [OptionsFromURL], and must
// reject any parameter left that it does not know, with an error wrapping
// ErrInvalidConfig, before any I/O.
type URLOpener interface {
	OpenLockerURL(ctx context.Context, u *url.URL) (*Locker, error)
}

// GuaranteesDeclarer is an optional interface of a [URLOpener]: Guarantees
// reports what every Locker it opens promises at best (its fencing grade
// and whether it depends on clocks), so that a URLMux refuses a purpose the
// backend cannot serve before any I/O. Without it the mux checks the
// Locker's Guarantees after opening.
type GuaranteesDeclarer interface {
	Guarantees() Guarantees
}

// URLMux maps URL schemes to URLOpeners. Its zero value is an empty mux,
// ready to use. It is safe for concurrent use.
type URLMux struct {
	mu      sync.RWMutex
	openers map[string]URLOpener
}

var defaultURLMux = new(URLMux)

// DefaultURLMux returns the URLMux that [Open] uses. Backend packages
// register their schemes on it from init, so importing one (for its side
// effect, with the blank identifier if need be) is enough.
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
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.openers[scheme]; dup {
		panic("dlock: RegisterLocker called twice for scheme " + scheme)
	}
	if m.openers == nil {
		m.openers = map[string]URLOpener{}
	}
	m.openers[scheme] = opener
}

// ValidLockerScheme reports whether scheme (case-insensitive) is
// registered.
func (m *URLMux) ValidLockerScheme(scheme string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.openers[strings.ToLower(scheme)]
	return ok
}

// LockerSchemes returns the registered URL schemes, sorted.
func (m *URLMux) LockerSchemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := make([]string, 0, len(m.openers))
	for k := range m.openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// OpenLocker parses rawURL and opens it with [URLMux.OpenLockerURL].
func (m *URLMux) OpenLocker(ctx context.Context, rawURL string) (*Locker, error) {
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
	return m.OpenLockerURL(ctx, u)
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

// OpenLockerURL returns a Locker for u, opened by the URLOpener registered
// for its scheme. The mux takes out the parameters it owns:
//
//	purpose  efficiency (the default) or correctness: what the lock is
//	         for. Opening a backend for correctness fails unless its
//	         Guarantees report consensus fencing and no clock dependence
//	         (etcd, ZooKeeper); see [Purpose]. An opener that declares
//	         its Guarantees ([GuaranteesDeclarer]) is refused before any
//	         I/O.
//	unsafe_accept_clock_dependent_lock
//	         true opens it anyway (logged as a warning by the Locker's
//	         Logger), for those who accept the risk
//
// and hands the rest to the opener. Errors are *OpError values (Op "open")
// wrapping the cause; an unknown scheme or a malformed URL matches
// ErrInvalidConfig.
func (m *URLMux) OpenLockerURL(ctx context.Context, u *url.URL) (*Locker, error) {
	if u == nil {
		return nil, opErr("open", "", fmt.Errorf("%w: nil URL", ErrInvalidConfig))
	}
	m.mu.RLock()
	opener, ok := m.openers[strings.ToLower(u.Scheme)]
	m.mu.RUnlock()
	if !ok {
		return nil, opErr("open", "", fmt.Errorf("%w: unknown scheme %q in %s (registered: %s; forgotten import?)",
			ErrInvalidConfig, u.Scheme, u.Redacted(), strings.Join(m.LockerSchemes(), ", ")))
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
	if d, ok := opener.(GuaranteesDeclarer); ok && !override {
		if err := purpose.Check(d.Guarantees()); err != nil {
			return nil, opErr("open", "", err) // before any I/O
		}
	}
	rest := *u
	rest.RawQuery = q.Encode()
	l, err := opener.OpenLockerURL(ctx, &rest)
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
	if err := purpose.Check(l.Guarantees()); err != nil {
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
// or "mem://", opened by [DefaultURLMux] (see [URLMux.OpenLockerURL] for
// the parameters the mux owns). The scheme picks the backend, which must be
// registered (by importing its package). Parameters every backend accepts:
//
//	ttl      default lease TTL (Options.TTL), a Go duration such as 10s
//	purpose  efficiency (the default) or correctness; see [Purpose]
//	unsafe_accept_clock_dependent_lock
//	         true opens a lock for correctness on a backend that cannot
//	         serve it (logged as a warning)
//
// Each backend documents its own parameters; an unknown one is an error
// matching ErrInvalidConfig, as is an unknown scheme. To open a URL with a
// client, Logger or Options of your own, register the backend's URLOpener
// on a URLMux of your own.
func Open(ctx context.Context, rawURL string) (*Locker, error) {
	return defaultURLMux.OpenLocker(ctx, rawURL)
}

// OptionsFromURL takes the Locker's parameters out of u's query and
// applies them to a copy of base (nil: all defaults), checked as [New]
// checks Options (the TTL against dlock's floor only). It returns the
// Options and u without those parameters, for the backend to parse the
// rest; it does no I/O. Every backend's URLOpener calls it, so the URL
// parameters and the Options fields share one validation. The parameter:
//
//	ttl  default lease TTL (Options.TTL), a Go duration such as 10s
//
// Errors wrap ErrInvalidConfig (a malformed query, a repeated or empty
// parameter, a bad value) or ErrInvalidTTL (a bad base TTL).
func OptionsFromURL(u *url.URL, base *Options) (*Options, *url.URL, error) {
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
		if err != nil || d < MinTTL || len(v) > 1 {
			return nil, nil, fmt.Errorf("%w: parameter ttl=%q: want one duration of at least %v, such as 10s", ErrInvalidConfig, v[0], MinTTL)
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

// Build is how a backend's constructor makes a Locker, so that bad Options
// are an error before any I/O: it checks opts as [New] does, with the TTL
// against lim (the backend's limits known without asking its servers),
// then calls newDriver and wraps the driver with New. If New refuses the
// Options on the limits the driver reports (learned from the servers), the
// driver is closed and New's error returned. newDriver's error is returned
// as it is.
func Build(opts *Options, lim Limits, newDriver func() (backend.Driver, error)) (*Locker, error) {
	if opts != nil {
		if err := opts.check(lim); err != nil {
			return nil, err
		}
	}
	d, err := newDriver()
	if err != nil {
		return nil, err
	}
	l, err := New(d, opts)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}
