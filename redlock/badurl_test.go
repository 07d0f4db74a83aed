package redlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
)

// badURLs are redlock URLs Open must reject before any I/O (issue 13).
var badURLs = []urltest.Case{
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?drift_factor=NaN", Want: dlock.ErrInvalidConfig, Text: `drift_factor="NaN"`},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?drift_factor=Inf", Want: dlock.ErrInvalidConfig, Text: `drift_factor="Inf"`},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?drift_factor=-Inf", Want: dlock.ErrInvalidConfig, Text: "drift_factor"},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?ttl=1s;prefix=x", Want: dlock.ErrInvalidConfig, Text: "invalid semicolon separator"},
	{URL: "redlock://ADDR,127.0.0.1:99999,127.0.0.1:3", Want: dlock.ErrInvalidConfig, Text: `port "99999"`},
	{URL: "redlock://ADDR,127.0.0.1:0,127.0.0.1:3", Want: dlock.ErrInvalidConfig, Text: `port "0"`},
	{URL: "redlock://ADDR,,127.0.0.1:3", Want: dlock.ErrInvalidConfig, Text: "empty host"},
	{URL: "redlock://", Want: dlock.ErrInvalidConfig, Text: "no nodes"},
	{URL: "redlock:///3", Want: dlock.ErrInvalidConfig, Text: "no nodes"},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3/-1", Want: dlock.ErrInvalidConfig, Text: "database"},
	{URL: "redlock://ADDR,127.0.0.1:2", Want: dlock.ErrInvalidConfig, Text: "odd number"},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?dial_timeout=-1s", Want: dlock.ErrInvalidConfig, Text: "dial_timeout"},
	{URL: "redlock://ADDR,127.0.0.1:2,127.0.0.1:3?pool_size=4", Want: dlock.ErrInvalidConfig, Text: `unknown parameter "pool_size" (known: dial_timeout, drift_factor, node_timeout, prefix, ttl)`},
}

func TestOpenBadURLs(t *testing.T) { urltest.Rejected(t, badURLs) }

func FuzzOpenURLRedlock(f *testing.F) {
	s := []string{"redlock://ADDR,127.0.0.1:2,127.0.0.1:3?ttl=5s&drift_factor=0.02&node_timeout=20ms&dial_timeout=1s"}
	for _, c := range badURLs {
		s = append(s, c.URL)
	}
	urltest.Fuzz(f, "redlock", s)
}

// TestOpenNoServer: with no node listening, or nodes that never answer,
// Open returns by its dial_timeout (plus a margin) and says why.
func TestOpenNoServer(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		a, b, c := urltest.RefusedAddr(t), urltest.RefusedAddr(t), urltest.RefusedAddr(t)
		urltest.Unreachable(t, "redlock://ADDR,"+b+","+c+"?dial_timeout=1s", a, time.Second, "connection refused", "a majority (2) is needed")
	})
	t.Run("silent", func(t *testing.T) {
		b, c := urltest.Listen(t).Addr(), urltest.Listen(t).Addr()
		urltest.Unreachable(t, "redlock://ADDR,"+b+","+c+"?dial_timeout=1s", urltest.Listen(t).Addr(), time.Second, "dial_timeout (1s)")
	})
	// dial_timeout bounds the whole Open, the wait for the script loads
	// (up to 4 × node_timeout) included: it used to come first, and took
	// about 5s more on nodes that never answer (go-redis's read timeout
	// and retries), which is the margin Unreachable allows, so the bound
	// here is narrower, still three times the dial_timeout.
	t.Run("silent, long node_timeout", func(t *testing.T) {
		a, b, c := urltest.Listen(t).Addr(), urltest.Listen(t).Addr(), urltest.Listen(t).Addr()
		u := "redlock://" + a + "," + b + "," + c + "?dial_timeout=1s&node_timeout=10s"
		start := time.Now()
		l, err := dlock.Open(t.Context(), u)
		took := time.Since(start)
		if err == nil {
			_ = l.Close()
			t.Fatalf("Open(%q) succeeded with nothing answering", u)
		}
		if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "dial_timeout (1s)") {
			t.Errorf("Open(%q) = %v, want ErrUnavailable naming dial_timeout (1s)", u, err)
		}
		if took > 3*time.Second {
			t.Errorf("Open(%q) took %v, want about its dial_timeout (1s), at most 3s", u, took.Round(time.Millisecond))
		}
	})
}
