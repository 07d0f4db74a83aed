package redlock_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// countingConn counts the bytes a client reads from its server.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Inspect reads a bounded prefix of the lock value on every node: a large
// value planted under the prefix on each node (issue 21, finding 8) is
// reported as held without being read whole anywhere. Seen failing before
// the bound: Inspect read 50 MiB from 3 nodes (value and counter, whole).
func TestInspectReadsBoundedValue(t *testing.T) {
	t.Parallel()
	const planted = 8 << 20
	key := uniqueKey(t)
	big := strings.Repeat("x", planted)
	var read atomic.Int64
	nodes := make([]goredis.UniversalClient, 3)
	for i, a := range addrs(servers.Redis(t, 5)[:3]) {
		admin := clients(t, []string{a})[0]
		for _, k := range []string{lockKey(key), lockKey(key) + ":fence"} {
			if err := admin.Set(t.Context(), k, big, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { admin.Del(context.WithoutCancel(t.Context()), k) })
		}
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, &read}, nil
		}})
		t.Cleanup(func() { _ = c.Close() })
		nodes[i] = c
	}
	l, err := redlock.New(t.Context(), nodes, &redlock.Options{NodeTimeout: testNodeTimeout, Locker: &dlock.Options{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	before := read.Load()
	info, err := l.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if got, most := read.Load()-before, int64(3*4<<10); got > most {
		t.Errorf("Inspect read %d bytes from 3 nodes for a %d-byte value on each; want at most %d", got, planted, most)
	}
	// The key exists on every node and blocks every acquire: held.
	if !info.Held || info.Token != 0 || info.Waiters != -1 {
		t.Errorf("Inspect = %+v; want held, token 0, waiters -1", info)
	}
}
