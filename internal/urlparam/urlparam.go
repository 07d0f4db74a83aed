// Package urlparam reads the parameters of a backend's URL, the one way
// every backend does: the query (malformed pairs are errors, never dropped),
// the host list (every host non-empty, every port 1-65535), durations,
// dial_timeout, and the final check that no unknown parameter is left, whose
// error lists the known ones. It does no I/O. Its errors wrap
// backend.ErrInvalidConfig.
//
// It also holds [DialRecorder], which keeps the last dial error of a client
// so that an Open cut by its dial_timeout can say why.
package urlparam

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// DefaultDialTimeout is the default of every backend's dial_timeout
// parameter: the bound on Open's first round trip to the servers.
const DefaultDialTimeout = 5 * time.Second

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
}

// Invalid returns an error wrapping backend.ErrInvalidConfig with the
// message fmt.Sprintf(format, args...).
func Invalid(format string, args ...any) error { return bad(format, args...) }

// Query parses u's query with url.ParseQuery. A malformed pair (a bad
// percent-escape, a semicolon) is an error, not silently dropped as
// u.Query() does.
func Query(u *url.URL) (url.Values, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, bad("query of %s: %w", u.Redacted(), err)
	}
	return q, nil
}

// Take removes the parameter name from q and returns its value. ok is false
// if it is absent; it is an error wrapping backend.ErrInvalidConfig if it is
// given more than once or empty.
// Backends take their known parameters, then reject whatever is left.
func Take(q url.Values, name string) (value string, ok bool, err error) {
	v, ok := q[name]
	if !ok {
		return "", false, nil
	}
	q.Del(name)
	if len(v) != 1 || v[0] == "" {
		return "", false, bad("parameter %s: want one non-empty value (leave it out for the default)", name)
	}
	return v[0], true, nil
}

// Duration takes the parameter name from q as a Go duration of at least
// least (which must be positive). ok is false if it is absent.
func Duration(q url.Values, name string, least time.Duration) (d time.Duration, ok bool, err error) {
	v, ok, err := Take(q, name)
	if err != nil || !ok {
		return 0, false, err
	}
	d, err = time.ParseDuration(v)
	if err != nil || d < least {
		return 0, false, bad("parameter %s=%q: want a duration of at least %v, such as 5s", name, v, least)
	}
	return d, true, nil
}

// DialTimeout takes the parameter dial_timeout from q: a duration of at
// least 1ms, default DefaultDialTimeout.
func DialTimeout(q url.Values) (time.Duration, error) {
	d, ok, err := Duration(q, "dial_timeout", time.Millisecond)
	if err != nil || !ok {
		return DefaultDialTimeout, err
	}
	return d, nil
}

// Int takes the parameter name from q as a decimal integer within
// [least, most]. ok is false if it is absent.
func Int(q url.Values, name string, least, most int64) (n int64, ok bool, err error) {
	v, ok, err := Take(q, name)
	if err != nil || !ok {
		return 0, false, err
	}
	n, err = strconv.ParseInt(v, 10, 64)
	if err != nil || n < least || n > most {
		return 0, false, bad("parameter %s=%q: want a whole number from %d to %d", name, v, least, most)
	}
	return n, true, nil
}

// NoneLeft returns an error naming a parameter left in q (the first in
// sorted order) and listing known, or nil if q is empty.
func NoneLeft(q url.Values, known ...string) error {
	if len(q) == 0 {
		return nil
	}
	left := make([]string, 0, len(q))
	for k := range q {
		left = append(left, k)
	}
	slices.Sort(left)
	known = slices.Clone(known)
	slices.Sort(known)
	return bad("unknown parameter %q (known: %s)", left[0], strings.Join(known, ", "))
}

// Hosts splits list, the host part of a URL (host[:port] entries separated
// by commas), into host:port addresses, giving defaultPort to entries
// without a port. Every host must be non-empty and every port a number from
// 1 to 65535; an IPv6 address goes in brackets ([::1]:2379). what names the
// servers in errors ("node", "endpoint", "server").
func Hosts(list, defaultPort, what string) ([]string, error) {
	if list == "" {
		return nil, bad("no %s given (want host:port)", what)
	}
	var out []string
	for _, h := range strings.Split(list, ",") {
		a, err := HostPort(h, defaultPort)
		if err != nil {
			return nil, bad("%s %q: %w", what, h, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// HostPort checks one host[:port] entry (see [Hosts]) and returns it as
// host:port. Its error does not wrap ErrInvalidConfig; Hosts wraps it.
func HostPort(h, defaultPort string) (string, error) {
	host, port := h, defaultPort
	switch i := strings.LastIndexByte(h, ':'); {
	case strings.HasPrefix(h, "["):
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errors.New("missing ] after an IPv6 address")
		}
		host = h[1:end]
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil && !strings.Contains(host, ":") {
			return "", errors.New("not an IPv6 address in brackets")
		}
		switch rest := h[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			port = rest[1:]
		default:
			return "", errors.New("want [ipv6]:port")
		}
	case i >= 0:
		host, port = h[:i], h[i+1:]
		if strings.Contains(host, ":") {
			return "", errors.New("an IPv6 address goes in brackets: [::1]:port")
		}
	}
	if host == "" {
		return "", errors.New("empty host")
	}
	if strings.ContainsAny(host, "/?#@[]% \x00") {
		return "", errors.New("bad character in host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "" {
		return "", fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return net.JoinHostPort(host, port), nil
}

// DialRecorder keeps the last failed dial (or handshake) of a client, so
// that an Open that ran out of time reports why instead of only "context
// deadline exceeded". The zero value is ready; it is safe for concurrent
// use.
type DialRecorder struct {
	mu   sync.Mutex
	last error
}

// Note records err, if it is not nil, as the last dial error. A dial cut
// short by its context (Open's deadline ending a retry) does not replace
// an error that says why the dials failed ("connection refused"), and no
// other error replaces a certificate that did not verify (the one a user
// must act on: with one server down and a wrong CA, the refused dials to
// the down one would otherwise hide it half the time).
func (r *DialRecorder) Note(err error) {
	if err == nil {
		return
	}
	cut := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	r.mu.Lock()
	switch {
	case r.last == nil, certErr(err):
		r.last = err
	case !cut && !certErr(r.last):
		r.last = err
	}
	r.mu.Unlock()
}

// certErr reports whether err is a server certificate that did not verify.
func certErr(err error) bool {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// Last returns the last dial error recorded, or nil.
func (r *DialRecorder) Last() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Explain returns err, the failure of Open's first round trip, with the
// deadline of dial_timeout named if ctx (bounded by it) ran out, and the
// last dial error appended if err does not say it already. err keeps its
// place in the chain (errors.Is still matches what it wrapped).
func (r *DialRecorder) Explain(ctx context.Context, err error, timeout time.Duration) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var extra []string
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), errDialTimeout) {
		extra = append(extra, fmt.Sprintf("no answer within dial_timeout (%v)", timeout))
	}
	if last := r.Last(); last != nil && !strings.Contains(msg, last.Error()) {
		extra = append(extra, "last dial error: "+last.Error())
	}
	if len(extra) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(extra, "; "))
}

// errDialTimeout is the cause of a context ended by [WithDialTimeout].
var errDialTimeout = errors.New("dial_timeout reached")

// WithDialTimeout returns ctx bounded by timeout, for Open's first round
// trip; [DialRecorder.Explain] recognises its end.
func WithDialTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, timeout, errDialTimeout)
}

// In returns err (from this package) with the backend's name, such as
// "redis", after the sentinel's text: "dlock: invalid configuration: redis:
// parameter ...". It still wraps err. A nil err stays nil.
func In(name string, err error) error {
	if err == nil {
		return nil
	}
	return named{name, err}
}

type named struct {
	name string
	err  error
}

func (n named) Error() string {
	s, sentinel := n.err.Error(), backend.ErrInvalidConfig.Error()+": "
	if rest, ok := strings.CutPrefix(s, sentinel); ok {
		return sentinel + n.name + ": " + rest
	}
	return n.name + ": " + s
}

func (n named) Unwrap() error { return n.err }
