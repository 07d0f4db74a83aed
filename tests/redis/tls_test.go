package redis_test

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// openWithLog opens rawURL on a mux whose redis opener logs to a new
// logRecorder.
func openWithLog(t *testing.T, rawURL string) (*dlock.Locker, *urltest.Warnings, error) {
	rec := &urltest.Warnings{}
	var mux driver.URLMux
	opener := &redis.URLOpener{Options: redis.Options{Locker: &dlock.Options{Logger: slog.New(rec)}}}
	mux.RegisterLocker("redis", opener)
	mux.RegisterLocker("rediss", opener)
	l, err := mux.OpenLocker(t.Context(), rawURL)
	if err == nil {
		t.Cleanup(func() { _ = l.Close() })
	}
	return l, rec, err
}

// rediss:// against a Redis serving TLS only (issue 21, finding 7): with
// ca= naming the server's CA a lock cycle works; without it (the system
// pool) or with another CA the certificate is refused, and the error says
// so; skip_verify=true connects and logs the warning.
func TestRedissCA(t *testing.T) {
	ss, caPEM := servers.RedisTLS(t, 1)
	addr := ss[0].Addr()
	dir := t.TempDir()
	ca := urltest.WriteFile(t, dir, "ca.pem", caPEM)
	otherCA, _ := urltest.SelfSigned(t, "another CA") // issued no server's certificate
	wrong := urltest.WriteFile(t, dir, "other-ca.pem", otherCA)

	t.Run("ca", func(t *testing.T) {
		l, rec, err := openWithLog(t, "rediss://"+addr+"?ca="+url.QueryEscape(ca))
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		lease, err := l.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if lease.Token() == 0 {
			t.Error("no fencing token over TLS")
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if w := rec.Containing(""); len(w) != 0 {
			t.Errorf("warnings logged for a verified TLS connection: %q", w)
		}
	})
	for name, q := range map[string]string{"system pool": "", "wrong ca": "&ca=" + url.QueryEscape(wrong)} {
		t.Run(name, func(t *testing.T) {
			_, _, err := openWithLog(t, "rediss://"+addr+"?dial_timeout=10s"+q)
			if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
				t.Errorf("Open = %v; want ErrUnavailable saying the certificate is signed by an unknown authority", err)
			}
		})
	}
	t.Run("skip_verify", func(t *testing.T) {
		l, rec, err := openWithLog(t, "rediss://"+addr+"?skip_verify=true")
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
