package zookeeper_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
	"github.com/dlock-go/dlock/zookeeper"
)

// badURLs are zk URLs Open must reject before any I/O (issue 13).
var badURLs = []urltest.Case{
	{URL: "zk://ADDR/a/./b", Want: dlock.ErrInvalidConfig, Text: "element . not allowed"},
	{URL: "zk://ADDR/a/../b", Want: dlock.ErrInvalidConfig, Text: "element .. not allowed"},
	{URL: "zk://ADDR/..", Want: dlock.ErrInvalidConfig, Text: "element .. not allowed"},
	{URL: "zk://ADDR/a%00b", Want: dlock.ErrInvalidConfig, Text: "U+0000"},
	{URL: "zk://ADDR/a%01b", Want: dlock.ErrInvalidConfig, Text: "U+0001"},
	{URL: "zk://ADDR/a%EF%BF%BFb", Want: dlock.ErrInvalidConfig, Text: "U+FFFF"},
	{URL: "zk://ADDR/a%ffb", Want: dlock.ErrInvalidConfig, Text: "not UTF-8"},
	{URL: "zk://ADDR//a", Want: dlock.ErrInvalidConfig, Text: "empty element"},
	{URL: "zk://ADDR/zookeeper", Want: dlock.ErrInvalidConfig, Text: "/zookeeper is the server's own subtree"},
	{URL: "zk://ADDR/zookeeper/locks", Want: dlock.ErrInvalidConfig, Text: "/zookeeper is the server's own subtree"},
	{URL: "zk://ADDR?ttl=1s;session_timeout=30s", Want: dlock.ErrInvalidConfig, Text: "invalid semicolon separator"},
	{URL: "zk://127.0.0.1:99999", Want: dlock.ErrInvalidConfig, Text: `port "99999"`},
	{URL: "zk://127.0.0.1:0", Want: dlock.ErrInvalidConfig, Text: `port "0"`},
	{URL: "zk://ADDR,,127.0.0.1:3", Want: dlock.ErrInvalidConfig, Text: "empty host"},
	{URL: "zk://", Want: dlock.ErrInvalidConfig, Text: "no servers"},
	{URL: "zk:///locks", Want: dlock.ErrInvalidConfig, Text: "no servers"},
	{URL: "zk://ADDR?dial_timeout=0", Want: dlock.ErrInvalidConfig, Text: "dial_timeout"},
	{URL: "zk://user@ADDR", Want: dlock.ErrInvalidConfig, Text: "user:password"},
	// go-zookeeper sends the session timeout as int32 milliseconds and
	// bounds its handshake by it: below 1ms it times out every handshake
	// at once; above 2^31-1 ms it wraps to a negative number.
	{URL: "zk://ADDR?session_timeout=1ns", Want: dlock.ErrInvalidConfig, Text: `session_timeout="1ns"`},
	{URL: "zk://ADDR?session_timeout=999us", Want: dlock.ErrInvalidConfig, Text: `session_timeout="999us"`},
	{URL: "zk://ADDR?session_timeout=10000h", Want: dlock.ErrInvalidConfig, Text: `session_timeout="10000h"`},
	// tick_time is the servers' tickTime: whole milliseconds in an int.
	{URL: "zk://ADDR?tick_time=0", Want: dlock.ErrInvalidConfig, Text: `tick_time="0"`},
	{URL: "zk://ADDR?tick_time=-2s", Want: dlock.ErrInvalidConfig, Text: `tick_time="-2s"`},
	{URL: "zk://ADDR?tick_time=999us", Want: dlock.ErrInvalidConfig, Text: `tick_time="999us"`},
	{URL: "zk://ADDR?tick_time=10000h", Want: dlock.ErrInvalidConfig, Text: `tick_time="10000h"`},
	{URL: "zk://ADDR?tick_time=2", Want: dlock.ErrInvalidConfig, Text: `tick_time="2"`},
	{URL: "zk://ADDR?tick_time=", Want: dlock.ErrInvalidConfig, Text: "tick_time"},
	// A ttl above what the session timeout allows, two thirds of it less
	// a tick (issue 22): refused at open, not after connecting.
	{URL: "zk://ADDR?session_timeout=5s&ttl=4s", Want: dlock.ErrInvalidConfig, Text: "TTL 4s (ttl) is above 1.333333334s, the longest a session timeout of 5s (session_timeout) allows with a tick of 2s (tick_time)"},
	{URL: "zk://ADDR?ttl=30s", Want: dlock.ErrInvalidTTL, Text: "TTL 30s (ttl) is above 24.666666667s, the longest a session timeout of 40s (session_timeout)"},
	{URL: "zk://ADDR?session_timeout=10s&tick_time=1s&ttl=5668ms", Want: dlock.ErrInvalidConfig, Text: "(session_timeout) allows with a tick of 1s (tick_time)"},
	{URL: "zk://ADDR?bogus=1", Want: dlock.ErrInvalidConfig, Text: `unknown parameter "bogus" (known: acl, ca, cert, dial_timeout, key, server_name, session_timeout, tick_time, ttl)`},
}

func TestOpenBadURLs(t *testing.T) { urltest.Rejected(t, badURLs) }

func FuzzOpenURLZooKeeper(f *testing.F) {
	s := []string{"zk://ADDR/locks/x?ttl=5s&session_timeout=30s&tick_time=2s&dial_timeout=1s", "zk://u:p@ADDR"}
	for _, c := range badURLs {
		s = append(s, c.URL)
	}
	urltest.Fuzz(f, "zk", s)
}

// TestOpenNoServer: with nothing listening, or a server that never
// answers, Open returns by its dial_timeout (plus a margin), says why, and
// leaves no client retrying (goleak in TestMain).
func TestOpenNoServer(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		urltest.Unreachable(t, "zk://ADDR?dial_timeout=1s", urltest.RefusedAddr(t), time.Second, "connection refused", "dial_timeout (1s)")
	})
	t.Run("silent", func(t *testing.T) {
		urltest.Unreachable(t, "zk://ADDR?dial_timeout=1s", urltest.Listen(t).Addr(), time.Second, "dial_timeout (1s)")
	})
}

// TestFailedOpenLogsNoWarnings: the dial failures of an Open that fails
// are in its error, not also logged as warnings (the client library logs
// each failed dial, once a second, while it retries; a server that accepts
// but never answers made the Driver warn "disconnected; leases are
// uncertain" with no session and no lease).
func TestFailedOpenLogsNoWarnings(t *testing.T) {
	for _, c := range []struct {
		name, addr, logged string
	}{
		{"refused", urltest.RefusedAddr(t), "connection refused"},
		{"silent", urltest.Listen(t).Addr(), "disconnected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rec conformance.LogRecorder
			var mux driver.URLMux
			mux.RegisterLocker("zk", &zookeeper.URLOpener{Options: zookeeper.Options{Locker: &dlock.Options{Logger: slog.New(&rec)}}})
			_, err := mux.OpenLocker(t.Context(), "zk://"+c.addr+"?dial_timeout=2500ms")
			if !errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("Open: %v; want ErrUnavailable", err)
			}
			if !rec.Contains(c.logged) {
				t.Fatalf("no Debug record with %q: the test shows nothing", c.logged)
			}
			if w := rec.Above(slog.LevelDebug); len(w) > 0 {
				t.Errorf("a failed Open logged above Debug: %q", w)
			}
		})
	}
}
