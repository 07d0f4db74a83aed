package etcd_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
)

// badURLs are etcd URLs Open must reject before any I/O (issue 13).
var badURLs = []urltest.Case{
	{URL: "etcd://ADDR?ttl=500ms", Want: dlock.ErrInvalidTTL, Text: "below the floor of 1s"},
	{URL: "etcd://ADDR?ttl=1s;request_timeout=2s", Want: dlock.ErrInvalidConfig, Text: "invalid semicolon separator"},
	{URL: "etcd://127.0.0.1:99999", Want: dlock.ErrInvalidConfig, Text: `port "99999"`},
	{URL: "etcd://127.0.0.1:0", Want: dlock.ErrInvalidConfig, Text: `port "0"`},
	{URL: "etcd://ADDR,,127.0.0.1:3", Want: dlock.ErrInvalidConfig, Text: "empty host"},
	{URL: "etcd://", Want: dlock.ErrInvalidConfig, Text: "no endpoints"},
	{URL: "etcd:///locks", Want: dlock.ErrInvalidConfig, Text: "no endpoints"},
	{URL: "etcd://ADDR?dial_timeout=soon", Want: dlock.ErrInvalidConfig, Text: "dial_timeout"},
	{URL: "etcd://ADDR?ca=/x.pem", Want: dlock.ErrInvalidConfig, Text: "needs the etcds scheme"},
	{URL: "etcd://ADDR?bogus=1", Want: dlock.ErrInvalidConfig, Text: `unknown parameter "bogus" (known: ca, cert, dial_timeout, key, request_timeout, server_name, ttl)`},
}

func TestOpenBadURLs(t *testing.T) { urltest.Rejected(t, badURLs) }

func seeds(scheme string) []string {
	s := []string{scheme + "://ADDR/locks?ttl=5s&request_timeout=2s&dial_timeout=1s"}
	for _, c := range badURLs { // in the fuzzer's scheme
		if rest, ok := strings.CutPrefix(c.URL, "etcd://"); ok {
			s = append(s, scheme+"://"+rest)
		}
	}
	return s
}

func FuzzOpenURLEtcd(f *testing.F)  { urltest.Fuzz(f, "etcd", seeds("etcd")) }
func FuzzOpenURLEtcds(f *testing.F) { urltest.Fuzz(f, "etcds", seeds("etcds")) }

// TestOpenNoServer: with nothing listening, or a server that never
// answers, Open returns by its dial_timeout (plus a margin) and says why.
func TestOpenNoServer(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		urltest.Unreachable(t, "etcd://ADDR?dial_timeout=1s", urltest.RefusedAddr(t), time.Second, "connection refused", "dial_timeout (1s)")
	})
	t.Run("silent", func(t *testing.T) {
		urltest.Unreachable(t, "etcd://ADDR?dial_timeout=1s", urltest.Listen(t).Addr(), time.Second, "dial_timeout (1s)")
	})
	// With credentials the client's first round trip (the token) is made
	// inside clientv3.New: its error names the dial failure too.
	t.Run("refused, with credentials", func(t *testing.T) {
		urltest.Unreachable(t, "etcd://user:secret@ADDR?dial_timeout=1s", urltest.RefusedAddr(t), time.Second, "connection refused")
	})
}

// TestFailedOpenLogsNoWarnings: the etcd client built from a URL logs to
// the Locker's Logger (not JSON on standard error), and the retries of an
// Open that fails, whose error names the dial failure, are Debug lines.
func TestFailedOpenLogsNoWarnings(t *testing.T) {
	var rec conformance.LogRecorder
	var mux driver.URLMux
	mux.RegisterLocker("etcd", &etcd.URLOpener{Options: etcd.Options{Locker: &dlock.Options{Logger: slog.New(&rec)}}})
	_, err := mux.OpenLocker(t.Context(), "etcd://"+urltest.RefusedAddr(t)+"?dial_timeout=1500ms")
	if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Open: %v; want ErrUnavailable naming the refused dial", err)
	}
	if !rec.Contains("dlock/etcd: client: ") {
		t.Fatal("no record of the etcd client's own lines: they did not reach the Logger")
	}
	if w := rec.Above(slog.LevelDebug); len(w) > 0 {
		t.Errorf("a failed Open logged above Debug: %q", w)
	}
}
