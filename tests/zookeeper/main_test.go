package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestMain(m *testing.M) { servers.Main(m) }

// testSession is the session timeout of the tests' Lockers: its TTL bound
// (100s - 100s/3 - testTick, about 66.47s) is above the longest lease the
// conformance suite asks for (a minute). The test servers allow up to two
// minutes.
const testSession = 100 * time.Second

// testTick is the test servers' tickTime (tests/servers), the
// Lockers' Options.TickTime unless a test sets its own.
const testTick = 200 * time.Millisecond

// quiet discards the client's log lines (connection churn in fault tests).
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newLocker returns a Locker with its own session, closed when tb ends.
func newLocker(tb testing.TB, srv []string, opts *zookeeper.Options) *dlock.Locker {
	tb.Helper()
	l, err := openLocker(tb.Context(), srv, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

func openLocker(ctx context.Context, srv []string, opts *zookeeper.Options) (*dlock.Locker, error) {
	o := zookeeper.Options{SessionTimeout: testSession, TickTime: testTick}
	if opts != nil {
		o = *opts
		if o.SessionTimeout == 0 {
			o.SessionTimeout = testSession
		}
		if o.TickTime == 0 {
			o.TickTime = testTick
		}
	}
	lo := dlock.Options{Logger: quiet}
	if o.Locker != nil {
		lo = *o.Locker
		if lo.Logger == nil {
			lo.Logger = quiet
		}
	}
	o.Locker = &lo
	return zookeeper.New(ctx, srv, &o)
}

// adminConn returns a plain client session, closed when tb ends.
func adminConn(tb testing.TB, srv []string) *zk.Conn {
	tb.Helper()
	c, _, err := zk.Connect(srv, 30*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	// Wait for the session: the first call blocks until there is one.
	if _, _, err := c.Exists("/"); err != nil {
		tb.Fatal(err)
	}
	return c
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// parent is the znode under which key's lock nodes queue (default prefix).
func parent(key string) string { return zookeeper.DefaultPrefix + "/" + encodeKey(key) }

func uniqueKey(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}

// reconnects marks a test whose client loses its connection while it has
// watches set and requests in flight, and reconnects. go-zookeeper v1.0.4
// has a data race of its own there: on a reconnect, sendSetWatches reads
// Conn.lastZxid while the new connection's recvLoop writes it (conn.go,
// lines 614 and 849), and the race detector fails any test that hits it,
// about one CI run in several. Under -race such a test is skipped;
// scripts/test.sh runs this package again without -race on a full run
// (step 6), where it runs (or by hand: DLOCK_TEST_RACE=off
// scripts/test.sh ./tests/zookeeper/). dlock's own code on those paths
// still runs under -race in the fault matrix's ZooKeeper cells (server
// kills, partitions), where the race has not fired so far.
func reconnects(t *testing.T) {
	t.Helper()
	if servers.RaceDetector {
		t.Skip("reconnects with watches set: go-zookeeper v1.0.4's lastZxid data race; runs without -race (scripts/test.sh step 6 on a full run, or DLOCK_TEST_RACE=off scripts/test.sh ./tests/zookeeper/)")
	}
}
