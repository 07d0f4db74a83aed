package redis_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redis"
)

// countingConn counts the bytes a client reads from the server.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// countingClient returns a client of addr that counts in n the bytes it
// reads, closed at the end of the test.
func countingClient(t *testing.T, addr string, n *atomic.Int64) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{conn, n}, nil
	}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// plantedSize is the size of the values planted under the prefix: large
// enough that reading them whole cannot pass for a bounded read.
const plantedSize = 8 << 20

// maxInspectRead bounds the bytes one Inspect may read: a few replies of
// at most a value's bounded prefix each.
const maxInspectRead = 4 << 10

// Inspect reads a bounded prefix of a lock value and of its fencing
// counter: a large value planted under the prefix (issue 21, finding 8: a
// 200 MB one made `dlock inspect` use 232 MB) is reported, as a held lock,
// without being read whole. Seen failing before the bound: Inspect read
// 16 MiB (both values, whole).
func TestInspectReadsBoundedValue(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	key := uniqueKey(t)
	big := strings.Repeat("x", plantedSize)
	for _, k := range []string{lockKey(key), lockKey(key) + ":fence"} {
		if err := admin.Set(t.Context(), k, big, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Del(context.WithoutCancel(t.Context()), k) })
	}
	var read atomic.Int64
	l, err := redis.New(t.Context(), countingClient(t, serverAddr(t), &read), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	before := read.Load()
	info, err := l.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if got := read.Load() - before; got > maxInspectRead {
		t.Errorf("Inspect read %d bytes from the server for a %d-byte value; want at most %d", got, plantedSize, maxInspectRead)
	}
	// The key exists and blocks every acquire: held, by no dlock grant
	// (no token: the counter is not a number).
	if !info.Held || info.Token != 0 || info.Waiters != -1 {
		t.Errorf("Inspect = %+v; want held, token 0, waiters -1", info)
	}
}

// Inspect reads a bounded part of a key held by shared leases too: a
// holder's value and a holder's token planted large under the prefix (the
// holders' sorted set and tokens hash of a lock value that says "shared
// holders") are cut, not read whole. Seen failing before the bound (issue
// 24 read both whole: Inspect read 16 MiB).
func TestInspectReadsBoundedSharedValues(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	key := uniqueKey(t)
	lk := lockKey(key)
	big := strings.Repeat("x", plantedSize)
	far := float64(time.Now().Add(time.Hour).UnixMilli())
	ctx := t.Context()
	for _, err := range []error{
		admin.Set(ctx, lk, "\x00s2:0", time.Minute).Err(),
		admin.ZAdd(ctx, lk+redisscript.HoldersSuffix, goredis.Z{Score: far, Member: big}, goredis.Z{Score: far, Member: "small"}).Err(),
		admin.HSet(ctx, lk+redisscript.TokensSuffix, "small", big).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		admin.Del(context.WithoutCancel(ctx), lk, lk+redisscript.HoldersSuffix, lk+redisscript.TokensSuffix)
	})
	var read atomic.Int64
	l, err := redis.New(ctx, countingClient(t, serverAddr(t), &read), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	before := read.Load()
	info, err := l.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := read.Load() - before; got > maxInspectRead {
		t.Errorf("Inspect read %d bytes from the server for %d-byte holder values; want at most %d", got, plantedSize, maxInspectRead)
	}
	if !info.Held || !info.Shared || info.Permits != 2 || len(info.Holders) != 2 {
		t.Errorf("Inspect = %+v; want held by 2 shared holders of a semaphore of 2", info)
	}
}
