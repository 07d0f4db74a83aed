package redlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// pipelineCounter counts the pipelines of two or more commands a client
// sends.
type pipelineCounter struct{ n atomic.Int64 }

func (h *pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) >= 2 {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestNoScriptKeepsOrderInPipeline: a node that has the release script but
// not the acquire script (it lost its scripts, and a lone release loaded
// its own again with EVAL, as go-redis's Script.Run does) gets an acquire
// and the release of the same lease queued behind it in one pipeline. The
// acquire's EVALSHA fails with NOSCRIPT while the release's runs, finding
// nothing; the acquire, sent again with EVAL after the pipeline, must not
// then set a key that nothing deletes: the release queued behind the
// acquire runs after it on the node.
//
// Node 2 sits behind a 50ms link, and its worker is kept busy by the
// release of another lease while the acquire and the release of the lease
// under test are queued, so that both go out together.
func TestNoScriptKeepsOrderInPipeline(t *testing.T) {
	t.Parallel()
	ss := servers.Redis(t, 3)
	nodes := addrs(ss)
	p, err := servers.NewProxy(nodes[2])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	nodes[2] = p.Addr()
	cs := clients(t, nodes)
	var pipes pipelineCounter
	cs[2].AddHook(&pipes)
	d, err := redlock.NewDriver(t.Context(), cs, &redlock.Options{NodeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const ttl = 30 * time.Second
	ctx := t.Context()

	// The blocker: a lease held on every node, released while node 2 is
	// slow.
	blocker, err := d.TryAcquire(ctx, backend.Request{Key: uniqueKey(t), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	direct := clients(t, addrs(ss))
	if err := direct[2].ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := redisscript.Release.Load(ctx, direct[2]).Err(); err != nil {
		t.Fatal(err)
	}
	p.Delay(50 * time.Millisecond)
	if err := blocker.Release(ctx); err != nil { // returns on nodes 0 and 1
		t.Fatal(err)
	}
	key := uniqueKey(t)
	le, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: ttl}) // granted by nodes 0 and 1; node 2's acquire queued
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(ctx); err != nil { // node 2's release queued behind its acquire
		t.Fatal(err)
	}
	d.Close() // waits for the calls still on their way
	p.Delay(0)
	if pipes.n.Load() == 0 {
		t.Fatal("node 2 got no pipeline: the acquire and the release went out apart; the test shows nothing")
	}
	if n, err := direct[2].Exists(ctx, lockKey(key)+redisscript.FenceSuffix).Result(); err != nil || n != 1 {
		t.Fatalf("node 2 has no fencing counter (exists=%d, err %v): the acquire never ran there; the test shows nothing", n, err)
	}
	if n, err := direct[2].Exists(ctx, lockKey(key)).Result(); err != nil || n != 0 {
		pttl := direct[2].PTTL(ctx, lockKey(key)).Val()
		t.Errorf("node 2: the released lease's key is left behind (exists=%d, PTTL %v, err %v)", n, pttl, err)
	}
}
