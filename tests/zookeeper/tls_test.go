package zookeeper_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// startTLS returns the package's ZooKeeper serving TLS only, and the path
// of its CA's certificate.
func startTLS(tb testing.TB) (*servers.ZooKeeperEnsemble, string) {
	tb.Helper()
	e := servers.ZooKeeperTLS(tb, 1)
	ca := filepath.Join(tb.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, e.CAPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	return e, ca
}

// TestTLS: zks:// and Options.TLS reach a ZooKeeper that serves TLS only,
// verifying its certificate; a CA that did not issue it, or plain zk://,
// gets no session (issue 21, finding 7).
func TestTLS(t *testing.T) {
	e, ca := startTLS(t)
	addr := e.Servers()[0]

	q := url.Values{"ca": {ca}, "session_timeout": {testSession.String()}, "tick_time": {testTick.String()}}
	l, err := dlock.Open(t.Context(), "zks://alice:secret-a@"+addr+"/tls?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	key := uniqueKey(t)
	lease, err := l.Acquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Go users: Options.TLS (here with a ServerName of the certificate).
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.CAPEM)
	other := openWithin(t, e.Servers(), &zookeeper.Options{Prefix: "/tls", Auth: "alice:secret-a",
		TLS: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}})
	if _, err := other.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire over TLS while held: %v, want ErrNotAcquired", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	// No session without TLS, or with a CA that did not issue the
	// server's certificate (the system pool).
	for _, u := range []string{"zk://" + addr + "?dial_timeout=3s", "zks://" + addr + "?dial_timeout=3s"} {
		if l, err := dlock.Open(t.Context(), u); !errors.Is(err, dlock.ErrUnavailable) {
			if err == nil {
				_ = l.Close()
			}
			t.Errorf("%s: %v, want ErrUnavailable", u, err)
		}
	}
}

// TestTransportWarnings: a password sent without TLS to a server off the
// loopback network is logged once at open; not over TLS, nor on loopback.
// The servers are reached through a Dialer that redirects a TEST-NET
// address (192.0.2.1, RFC 5737) to the test server.
func TestTransportWarnings(t *testing.T) {
	plain := servers.ZooKeeper(t, 1).Servers()[0]
	e, _ := startTLS(t)
	secure := e.Servers()[0]
	const remote = "192.0.2.1:2181"
	to := func(addr string) func(string, string, time.Duration) (net.Conn, error) {
		return func(network, _ string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout(network, addr, timeout)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.CAPEM)
	tc := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	const warning = "sent in plaintext"
	for _, c := range []struct {
		name   string
		server string
		o      zookeeper.Options
		want   int
	}{
		{"remote, no TLS", remote, zookeeper.Options{Auth: "alice:secret-a", Dialer: to(plain)}, 1},
		{"remote, TLS", remote, zookeeper.Options{Auth: "alice:secret-a", Dialer: to(secure), TLS: tc}, 0},
		{"loopback, no TLS", plain, zookeeper.Options{Auth: "alice:secret-a"}, 0},
	} {
		rec := &records{}
		c.o.Prefix = uniquePrefix()
		c.o.Locker = &dlock.Options{Logger: slog.New(rec)}
		openWithin(t, []string{c.server}, &c.o)
		if got := rec.with(warning); len(got) != c.want {
			t.Errorf("%s: warnings %q, want %d", c.name, got, c.want)
		}
	}
	rec := &records{}
	openWithin(t, []string{remote}, &zookeeper.Options{Prefix: uniquePrefix(), Dialer: to(plain), Locker: &dlock.Options{Logger: slog.New(rec)}})
	if got := rec.with("no credentials and no ACL"); len(got) != 1 {
		t.Errorf("remote, no credentials: warnings %q, want one", got)
	}
}

// openWithin is newLocker with a bound on the wait for a session.
func openWithin(tb testing.TB, srv []string, opts *zookeeper.Options) *dlock.Locker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	l, err := openLocker(ctx, srv, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}
