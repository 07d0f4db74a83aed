package redlock_test

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// openWithLog opens rawURL on a mux whose redlock opener logs to a new
// logRecorder.
func openWithLog(t *testing.T, rawURL string) (*dlock.Locker, *urltest.Warnings, error) {
	rec := &urltest.Warnings{}
	var mux driver.URLMux
	opener := &redlock.URLOpener{Options: redlock.Options{NodeTimeout: testNodeTimeout, Locker: &dlock.Options{Logger: slog.New(rec)}}}
	mux.RegisterLocker("redlocks", opener)
	l, err := mux.OpenLocker(t.Context(), rawURL)
	if err == nil {
		t.Cleanup(func() { _ = l.Close() })
	}
	return l, rec, err
}

// redlocks:// dials every node over TLS (issue 21, finding 7): over three
// TLS-only Redis servers, with ca= naming their CA a lock cycle works;
// another CA is refused with the x509 error; skip_verify=true connects
// and logs one warning.
func TestRedlocksTLS(t *testing.T) {
	ss, caPEM := servers.RedisTLS(t, 3)
	hosts := strings.Join(addrs(ss), ",")
	dir := t.TempDir()
	ca := urltest.WriteFile(t, dir, "ca.pem", caPEM)
	otherCA, _ := urltest.SelfSigned(t, "another CA") // issued no server's certificate
	wrong := urltest.WriteFile(t, dir, "other-ca.pem", otherCA)

	t.Run("ca", func(t *testing.T) {
		l, rec, err := openWithLog(t, "redlocks://"+hosts+"?ca="+url.QueryEscape(ca))
		if err != nil {
			t.Fatal(err)
		}
		lease, err := l.Acquire(t.Context(), uniqueKey(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if w := rec.Containing(""); len(w) != 0 {
			t.Errorf("warnings logged for verified TLS connections: %q", w)
		}
	})
	t.Run("wrong ca", func(t *testing.T) {
		_, _, err := openWithLog(t, "redlocks://"+hosts+"?dial_timeout=10s&ca="+url.QueryEscape(wrong))
		if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("Open = %v; want ErrUnavailable saying the certificate is signed by an unknown authority", err)
		}
	})
	t.Run("skip_verify", func(t *testing.T) {
		l, rec, err := openWithLog(t, "redlocks://"+hosts+"?skip_verify=true")
		if err != nil {
			t.Fatal(err)
		}
		if w := rec.Containing("skip_verify=true: the server's certificate is not checked"); len(w) != 1 {
			t.Errorf("warnings about skip_verify: %q; want one", w)
		}
		if _, err := l.Inspect(t.Context(), uniqueKey(t)); err != nil {
			t.Fatal(err)
		}
	})
}
