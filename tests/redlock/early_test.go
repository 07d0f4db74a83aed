package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// holdFor makes nodes hold key for another holder (a lock key with a
// foreign value) for d, so that they refuse it.
func holdFor(t *testing.T, nodes []goredis.UniversalClient, key string, d time.Duration) {
	t.Helper()
	for _, c := range nodes {
		if err := c.Set(t.Context(), lockKey(key), "another holder", d).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireFailsOnceMajorityImpossible: three of five nodes refuse (the
// key is held there) and the other two are blackholed (servers.Proxy). The
// attempt is refused as soon as the three refusals are in, without waiting
// for the blackholed nodes' round trips to reach the per-node timeout.
func TestAcquireFailsOnceMajorityImpossible(t *testing.T) {
	t.Parallel()
	ss := servers.Redis(t, 5)
	nodes := addrs(ss)
	var links []*servers.Proxy
	for i := 3; i < 5; i++ {
		p, err := servers.NewProxy(nodes[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		links = append(links, p)
		nodes[i] = p.Addr()
	}
	const nodeTimeout = 2 * time.Second
	d, err := redlock.NewDriver(t.Context(), clients(t, nodes), &redlock.Options{NodeTimeout: nodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	holdFor(t, clients(t, addrs(ss[:3])), key, time.Minute)
	for _, p := range links {
		p.Blackhole()
	}
	begin := time.Now()
	_, err = d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 30 * time.Second}) // per-node timeout: min(2s, 3s)
	took := time.Since(begin)
	for _, p := range links {
		p.Heal()
	}
	d.Close() // waits for the blackholed nodes' calls and the clean-up
	if !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire with 3 of 5 refusing, 2 blackholed = %v, want ErrNotAcquired", err)
	}
	if took >= nodeTimeout {
		t.Errorf("the refusal took %v: it waited for the blackholed nodes (per-node timeout %v)", took, nodeTimeout)
	}
	t.Logf("3 of 5 refusing, 2 blackholed: %v after %v", err, took.Round(time.Millisecond))
}

// TestReleaseOnlyWhereItMayHold: nodes 3 and 4 refuse the acquire (the key
// is held there for another holder): the lease holds nothing there, and
// neither its Refresh nor its Release sends them anything. (Nodes 0-2 sit
// behind a 30ms link, so that the refusals are in before the grant is
// decided: a node whose reply is still to come may hold the key, and does
// get the release.)
func TestReleaseOnlyWhereItMayHold(t *testing.T) {
	ss := servers.Redis(t, 5)
	admin := clients(t, addrs(ss))
	nodes := addrs(ss)
	for i := range 3 {
		p, err := servers.NewProxy(nodes[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		p.Delay(30 * time.Millisecond)
		nodes[i] = p.Addr()
	}
	cs := clients(t, nodes)
	hooks := make([]*scriptCounter, len(cs))
	for i, c := range cs {
		hooks[i] = new(scriptCounter)
		c.AddHook(hooks[i])
	}
	d, err := redlock.NewDriver(t.Context(), cs, &redlock.Options{NodeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	holdFor(t, admin[3:], key, time.Minute)
	before := make([]int, len(hooks))
	for i, h := range hooks {
		before[i] = h.count()
	}
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Refresh(t.Context(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.Close() // every call, in the background too, has been sent
	for i, h := range hooks {
		want := 3 // acquire, refresh, release
		if i >= 3 {
			want = 1 // the refused acquire
		}
		if n := h.count() - before[i]; n != want {
			t.Errorf("node %d: %d scripts, want %d", i, n, want)
		}
	}
	for i, c := range admin {
		v, err := c.Get(t.Context(), lockKey(key)).Result()
		switch {
		case i < 3 && !errors.Is(err, goredis.Nil):
			t.Errorf("node %d: the released key is still there (%q, %v)", i, v, err)
		case i >= 3 && (err != nil || v != "another holder+"):
			t.Errorf("node %d: the other holder's key = %q, %v; want it untouched but for the waiter's mark", i, v, err)
		}
	}
}

// refreshCounter counts the refresh scripts a client sends, and the round
// trips (single commands or pipelines) that carry them.
type refreshCounter struct {
	mu             sync.Mutex
	trips, scripts int
}

func (h *refreshCounter) count(cmds []goredis.Cmder) {
	n := 0
	for _, cmd := range cmds {
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 && args[1] == redisscript.Refresh.Hash() {
			n++
		}
	}
	if n > 0 {
		h.mu.Lock()
		h.trips++
		h.scripts += n
		h.mu.Unlock()
	}
}

func (h *refreshCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *refreshCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.count([]goredis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *refreshCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

func (h *refreshCounter) counts() (trips, scripts int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trips, h.scripts
}

// TestRefreshBatch: the Driver is a backend.BatchRefresher. One
// RefreshBatch of 50 held leases, one released lease and one lost on a
// majority (its key deleted on three nodes) sends each node its refreshes
// in one round trip; the held leases are extended on every node, the other
// two get ErrNotHeld.
func TestRefreshBatch(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	cs := clients(t, a)
	hooks := make([]*refreshCounter, len(cs))
	for i, c := range cs {
		hooks[i] = new(refreshCounter)
		c.AddHook(hooks[i])
	}
	d, err := redlock.NewDriver(t.Context(), cs, &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	br, ok := any(d).(backend.BatchRefresher)
	if !ok {
		t.Fatal("the redlock Driver is not a backend.BatchRefresher")
	}
	const held = 50
	base := uniqueKey(t)
	var reqs []backend.RefreshRequest
	for k := range held + 2 {
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: fmt.Sprintf("%s-%d", base, k), TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, backend.RefreshRequest{Lease: l, TTL: time.Minute})
	}
	released := reqs[held].Lease
	if err := released.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	reqs = append(reqs[:held], reqs[held+1:]...) // the released lease is not refreshed...
	for _, c := range admin[:3] {                // ...and this one is lost on a majority
		if err := c.Del(t.Context(), lockKey(fmt.Sprintf("%s-%d", base, held+1))).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The released lease, refreshed anyway (as a stale lease would be).
	reqs = append(reqs, backend.RefreshRequest{Lease: released, TTL: time.Minute})
	// The released lease's key is gone everywhere.
	if !waitFor(10*time.Second, func() bool {
		return countNodes(admin, func(c goredis.UniversalClient) bool {
			n, err := c.Exists(t.Context(), lockKey(fmt.Sprintf("%s-%d", base, held))).Result()
			return err == nil && n == 0
		}) == len(admin)
	}) {
		t.Fatal("the released lease's key is still on some node")
	}
	before := make([][2]int, len(hooks))
	for i, h := range hooks {
		before[i][0], before[i][1] = h.counts()
	}
	br.RefreshBatch(t.Context(), reqs)
	for k, r := range reqs {
		switch {
		case k < held:
			if r.Err != nil || r.Granted != time.Minute {
				t.Errorf("held lease %d: granted %v, err %v; want 1m", k, r.Granted, r.Err)
			}
		case !errors.Is(r.Err, backend.ErrNotHeld):
			t.Errorf("request %d (lost or released): granted %v, err %v; want ErrNotHeld", k, r.Granted, r.Err)
		}
	}
	for k := range held {
		key := lockKey(fmt.Sprintf("%s-%d", base, k))
		for i, c := range admin {
			if pttl, err := c.PTTL(t.Context(), key).Result(); err != nil || pttl < 30*time.Second {
				t.Errorf("lease %d on node %d: PTTL %v, %v; want it extended to about 1m", k, i, pttl, err)
			}
		}
	}
	for i, h := range hooks {
		trips, scripts := h.counts()
		trips -= before[i][0]
		scripts -= before[i][1]
		// Every node: the 50 held leases and the lost one. The released
		// lease holds nothing anywhere and is sent nowhere (but for a
		// node whose delete's reply it had not recorded yet: at most one
		// more).
		if scripts < held+1 || scripts > held+2 {
			t.Errorf("node %d: %d refresh scripts, want %d (or one more)", i, scripts, held+1)
		}
		if trips != 1 {
			t.Errorf("node %d: %d round trips for %d refreshes, want 1 (a pipeline)", i, trips, scripts)
		}
	}
}
