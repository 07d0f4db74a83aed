// Package urltest holds the shared parts of the backends' bad-URL tests,
// fuzz tests and bounded-Open tests: a listener that records whether
// anything connected (to prove "before any I/O"), the table check, the fuzz
// body and the no-server check.
package urltest

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Recorder is a TCP listener on 127.0.0.1 that never answers; Conns tells
// how many connections were made to it.
type Recorder struct {
	ln *net.TCPListener
}

// Listen starts a Recorder, closed when tb ends.
func Listen(tb testing.TB) *Recorder {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	return &Recorder{ln: ln.(*net.TCPListener)}
}

// Addr is the listener's host:port.
func (r *Recorder) Addr() string { return r.ln.Addr().String() }

// Conns accepts (and closes) the connections made so far and returns how
// many there were. A connection whose dial returned before Conns is called
// is in the listen queue already (the kernel completes the handshake before
// connect returns), and Accept takes it without waiting; the short deadline
// only ends the loop when the queue is empty.
func (r *Recorder) Conns() int {
	n := 0
	for {
		_ = r.ln.SetDeadline(time.Now().Add(10 * time.Millisecond))
		c, err := r.ln.Accept()
		if err != nil {
			return n
		}
		_ = c.Close()
		n++
	}
}

// RefusedAddr returns a 127.0.0.1 address nothing listens on (a port just
// released), where a dial is refused.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// Case is a URL Open must reject before any I/O. ADDR in URL stands for
// the Recorder's address.
type Case struct {
	URL  string
	Want error  // dlock.ErrInvalidConfig or dlock.ErrInvalidTTL
	Text string // a part of the error's text
}

// Rejected opens each case with dlock.Open and checks that it fails with
// c.Want and c.Text, without a panic and without connecting to the
// Recorder its ADDR points at.
func Rejected(t *testing.T, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.URL, func(t *testing.T) {
			r := Listen(t)
			u := strings.ReplaceAll(c.URL, "ADDR", r.Addr())
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			l, err := open(ctx, u)
			if err == nil {
				_ = l.Close()
				t.Fatalf("Open(%q) succeeded, want an error matching %v", u, c.Want)
			}
			if !errors.Is(err, c.Want) {
				t.Errorf("Open(%q) = %v, want an error matching %v", u, err, c.Want)
			}
			if !strings.Contains(err.Error(), c.Text) {
				t.Errorf("Open(%q) = %v, want %q in the text", u, err, c.Text)
			}
			if n := r.Conns(); n != 0 {
				t.Errorf("Open(%q) connected %d times before rejecting it", u, n)
			}
		})
	}
}

// open is dlock.Open, with a panic turned into a test failure's error.
func open(ctx context.Context, u string) (l *dlock.Locker, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{p}
		}
	}()
	return dlock.Open(ctx, u)
}

type panicError struct{ v any }

func (p *panicError) Error() string {
	return "panic: " + strings.TrimSpace(strings.ReplaceAll(anyString(p.v), "\n", " "))
}

func anyString(v any) string {
	if e, ok := v.(error); ok {
		return e.Error()
	}
	if s, ok := v.(string); ok {
		return s
	}
	return "non-string panic value"
}

// Fuzz runs dlock.Open on fuzzed URLs of a scheme, seeded with seeds (ADDR
// stands for a fresh Recorder's address). Open runs with a context already
// cancelled, so a URL that passes the checks ends at its first I/O. It
// checks: no panic; every error matches ErrInvalidConfig, ErrInvalidTTL or
// ErrUnavailable; no connection to the Recorder for a URL rejected as
// invalid. Inputs naming a host other than 127.0.0.1 (or ADDR) are
// skipped: the fuzzer must not reach the network beyond the loopback.
func Fuzz(f *testing.F, scheme string, seeds []string) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r := Listen(t)
		s = strings.ReplaceAll(s, "ADDR", r.Addr())
		u, err := url.Parse(s)
		if err != nil || !strings.EqualFold(u.Scheme, scheme) || !loopbackOnly(u.Host) {
			t.Skip()
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		l, err := open(ctx, s)
		if err == nil {
			_ = l.Close()
			return
		}
		var p *panicError
		if errors.As(err, &p) {
			t.Fatalf("Open(%q) panicked: %v", s, p.v)
		}
		invalid := errors.Is(err, dlock.ErrInvalidConfig) || errors.Is(err, dlock.ErrInvalidTTL)
		if !invalid && !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("Open(%q) = %v: matches none of ErrInvalidConfig, ErrInvalidTTL, ErrUnavailable", s, err)
		}
		if n := r.Conns(); invalid && n != 0 {
			t.Fatalf("Open(%q) = %v after connecting %d times: rejected, but not before I/O", s, err, n)
		}
	})
}

// loopbackOnly reports whether every host in a URL's host list is
// 127.0.0.1 or empty (which the backends must reject).
func loopbackOnly(hosts string) bool {
	for _, h := range strings.Split(hosts, ",") {
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			h = h[:i]
		}
		if h != "" && h != "127.0.0.1" {
			return false
		}
	}
	return true
}

// Unreachable opens rawURL (with ADDR standing for addr, where nothing
// answers) under a long context and checks that Open fails within
// dialTimeout plus a generous margin, with ErrUnavailable and every part
// of want in the error's text. It guards "Open never hangs", not speed.
func Unreachable(t *testing.T, rawURL, addr string, dialTimeout time.Duration, want ...string) {
	t.Helper()
	u := strings.ReplaceAll(rawURL, "ADDR", addr)
	ctx, cancel := context.WithTimeout(t.Context(), dialTimeout+60*time.Second)
	defer cancel()
	start := time.Now()
	l, err := open(ctx, u)
	took := time.Since(start)
	if err == nil {
		_ = l.Close()
		t.Fatalf("Open(%q) succeeded with nothing answering", u)
	}
	if limit := dialTimeout + 5*time.Second; took > limit {
		t.Errorf("Open(%q) took %v, want at most dial_timeout (%v) + 5s", u, took.Round(time.Millisecond), dialTimeout)
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Open(%q) = %v, want an error matching ErrUnavailable", u, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Open(%q) = %v, want %q in the text", u, err, w)
		}
	}
	t.Logf("Open(%q) failed after %v: %v", u, took.Round(time.Millisecond), err)
}
