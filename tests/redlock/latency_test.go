package redlock_test

import (
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestMajoritySlow: three of five nodes sit behind a link whose latency
// (each way, a servers.Proxy's Delay) is longer than the TTL. Their answers
// come too late to count: TryAcquire returns no lease (ErrUnavailable)
// without waiting for them (the round is cut at the per-node timeout), and
// the keys the late SETs made on the slow nodes are deleted again by the
// release sent on all nodes, so nothing is left once the slow link has
// delivered everything. (The fault matrix's SlowLink row checks that no
// lease is handed out and that the refusals are clean, on Redis and
// Redlock; the per-node cut and the clean-up of the late keys are this
// test's.)
func TestMajoritySlow(t *testing.T) {
	t.Parallel()
	const (
		ttl     = 2 * time.Second            // per-node timeout: a tenth, 200ms
		latency = ttl + 100*time.Millisecond // each way
	)
	ss := fiveNodes(t)
	nodes := addrs(ss)
	var links []*servers.Proxy
	for i := 2; i < 5; i++ {
		p, err := servers.NewProxy(nodes[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		links = append(links, p)
		nodes[i] = p.Addr()
	}
	cs := clients(t, nodes)
	l, err := redlock.New(t.Context(), cs, &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Put two open connections in each node's pool while the links are
	// fast (New has loaded the scripts): go-redis drops a connection whose
	// command timed out, and a new connection's handshake over a slow link
	// would not finish within the per-node timeout, so the release (on the
	// second connection) would not be sent at all.
	for _, c := range cs {
		c := c.(*goredis.Client)
		c1, c2 := c.Conn(), c.Conn() // held at once: two connections
		for _, cn := range []*goredis.Conn{c1, c2} {
			if err := cn.Ping(t.Context()).Err(); err != nil {
				t.Fatalf("opening a connection: %v", err)
			}
		}
		c1.Close() // back to the pool
		c2.Close()
		if n := c.PoolStats().IdleConns; n < 2 {
			t.Fatalf("%d idle connections in the pool, want 2", n)
		}
	}
	for _, p := range links {
		p.Delay(latency)
	}
	key := uniqueKey(t)
	begin := time.Now()
	le, err := l.TryAcquire(t.Context(), key, &dlock.AcquireOptions{TTL: ttl})
	took := time.Since(begin)
	if err == nil {
		t.Fatalf("TryAcquire with 3 of 5 behind a %v link returned a lease (%v of validity left)", latency, time.Until(le.Deadline()))
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("TryAcquire with 3 of 5 slow = %v, want ErrUnavailable", err)
	}
	if took >= latency {
		// The attempt is cut at the per-node timeout (200ms), then
		// waits at most max(NodeTimeout, 100ms) for the release.
		t.Errorf("the attempt took %v: it waited for the slow nodes' %v answers", took, latency)
	}
	t.Logf("3 of 5 behind a %v link: %v after %v", latency, err, took.Round(time.Millisecond))

	// The slow nodes get the SET at latency and the release, sent about
	// 200ms later, at latency+200ms; the SET's key would expire by itself
	// at latency+ttl. Look in between, so that this shows the release
	// removed it.
	direct := clients(t, addrs(ss))
	time.Sleep(time.Until(begin.Add(latency + ttl/2)))
	defer func() {
		if late := time.Since(begin); late >= latency+ttl {
			t.Fatalf("the check ended %v after the attempt, when the keys had expired anyway: inconclusive", late)
		}
	}()
	for i, c := range direct {
		if n, err := c.Exists(t.Context(), lockKey(key)).Result(); err != nil || n != 0 {
			t.Errorf("node %d: key left behind (exists=%d, err %v)", i, n, err)
		}
		// The fencing counter, which stays, shows that the late SET
		// did reach the slow nodes: the release had something to do.
		if n, err := c.Exists(t.Context(), lockKey(key)+redisscript.FenceSuffix).Result(); i >= 2 && (err != nil || n != 1) {
			t.Errorf("slow node %d: no fencing counter (exists=%d, err %v): the late SET never arrived", i, n, err)
		}
	}
}
