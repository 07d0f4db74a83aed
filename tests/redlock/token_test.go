package redlock_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// scriptCounter is a go-redis hook that counts the scripts a client sends
// (EVALSHA, and EVAL after a NOSCRIPT).
type scriptCounter struct {
	mu sync.Mutex
	n  int
}

func (h *scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.mu.Lock()
			h.n++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "evalsha" || name == "eval" {
				h.mu.Lock()
				h.n++
				h.mu.Unlock()
			}
		}
		return next(ctx, cmds)
	}
}

func (h *scriptCounter) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// TestCycleTwoScriptsPerNode: with the nodes' clocks in step (one machine),
// a grant and its release cost one script per node each: the release
// raises the counters to the token, no separate write-back. Once the
// release has reached every node (Release returns when a majority has
// confirmed; the others' deletes finish in the background), every node's
// counter is at least the token.
func TestCycleTwoScriptsPerNode(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	cs := clients(t, a)
	hooks := make([]*scriptCounter, len(cs))
	for i, c := range cs {
		hooks[i] = new(scriptCounter)
		c.AddHook(hooks[i])
	}
	d, err := redlock.NewDriver(t.Context(), cs, &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"
	const cycles = 10
	before := make([]int, len(hooks))
	for i, h := range hooks {
		before[i] = h.count()
	}
	var last uint64
	for range cycles {
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("token %d after %d", l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		done := func(c goredis.UniversalClient) bool {
			n, err := c.Get(t.Context(), fence).Uint64()
			gone, err2 := c.Exists(t.Context(), lockKey(key)).Result()
			return err == nil && err2 == nil && n >= l.Token() && gone == 0
		}
		if !waitFor(10*time.Second, func() bool { return countNodes(admin, done) == len(admin) }) {
			for i, c := range admin {
				n, err := c.Get(t.Context(), fence).Uint64()
				t.Logf("node %d: counter %d (%v), lock key gone: %v", i, n, err, done(c))
			}
			t.Fatalf("after Release: the lock key gone and the counter at least the token %d on %d of %d nodes", l.Token(), countNodes(admin, done), len(admin))
		}
	}
	for i, h := range hooks {
		if n := h.count() - before[i]; n != 2*cycles {
			t.Errorf("node %d: %d scripts for %d grant+release cycles; want %d (one acquire, one release each)", i, n, cycles, 2*cycles)
		}
	}
}

// majorityWith0 makes the next grant of key come from nodes 0, 1 and 2:
// nodes 3 and 4 hold it for another holder for hold (a lock key with a
// foreign value), so they refuse. A grant returns once a majority has
// granted, so without this the majority deciding the token could be any
// three nodes, and node 0's counter, set ahead by the tests, would not
// always count.
func majorityWith0(t *testing.T, admin []goredis.UniversalClient, key string, hold time.Duration) {
	t.Helper()
	for _, c := range admin[3:] {
		if err := c.Set(t.Context(), lockKey(key), "another holder", hold).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriteBackToNodeFarBehind: a node whose clock would not pass the
// token before the lease can expire there gets the token written back
// right after the grant, while the lease is held; and a lease that expires
// unreleased is followed by a larger token.
func TestWriteBackToNodeFarBehind(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	d, err := redlock.NewDriver(t.Context(), clients(t, a), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"
	// Node 0's counter is an hour ahead of every clock: the token comes
	// from it, and the other nodes' clocks are an hour behind it.
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	if err := admin[0].Set(t.Context(), fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	majorityWith0(t, admin, key, time.Second)
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != ahead+1 {
		t.Fatalf("token %d, want %d (node 0's counter + 1)", l.Token(), ahead+1)
	}
	raised := func(c goredis.UniversalClient) bool {
		n, err := c.Get(t.Context(), fence).Uint64()
		return err == nil && n >= l.Token()
	}
	// The granting nodes (0-2): the two behind get the write-back.
	if !waitFor(10*time.Second, func() bool { return countNodes(admin[:3], raised) == 3 }) {
		t.Errorf("while the lease is held, %d of the 3 granting nodes' counters reached the token; want all (the write-back)", countNodes(admin[:3], raised))
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Release returns once a majority has confirmed: wait for the rest.
	expiredEverywhere(t, admin[:3], key)

	// Expiry without release, clocks in step: the next token is larger.
	l1, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var l2tok uint64
	if !waitFor(10*time.Second, func() bool {
		l2, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
		if err != nil {
			return false
		}
		l2tok = l2.Token()
		_ = l2.Release(t.Context())
		return true
	}) {
		t.Fatal("no grant after the first lease expired")
	}
	if l2tok <= l1.Token() {
		t.Errorf("after an unreleased lease expired: token %d, not above %d", l2tok, l1.Token())
	}
}

// TestTokensExactBeyond2To53: tokens stay exact and increasing once the
// counters pass 2^53, where Lua numbers (doubles) can no longer tell
// neighbouring integers apart.
func TestTokensExactBeyond2To53(t *testing.T) {
	a := addrs(servers.Redis(t, 5))
	admin := clients(t, a)
	d, err := redlock.NewDriver(t.Context(), clients(t, a), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"
	const start = 1<<53 + 2
	// Node 0 one below the others: its counter must be raised exactly.
	for i, c := range admin {
		v := uint64(start)
		if i == 0 {
			v--
		}
		if err := c.Set(t.Context(), fence, strconv.FormatUint(v, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	last := uint64(start)
	for i := range 4 {
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("grant %d with the counters at %d: token %d, want above it", i, last, l.Token())
		}
		last = l.Token()
	}
	// Every counter, node 0's included, holds the last token exactly, once
	// the release has reached every node (Release returns when a
	// majority has confirmed).
	exact := func(c goredis.UniversalClient) bool {
		n, err := c.Get(t.Context(), fence).Uint64()
		return err == nil && n == last
	}
	if !waitFor(10*time.Second, func() bool { return countNodes(admin, exact) == len(admin) }) {
		for i, c := range admin {
			if n, err := c.Get(t.Context(), fence).Uint64(); err != nil || n != last {
				t.Errorf("node %d's counter = %d, %v; want %d", i, n, err, last)
			}
		}
	}
}

// expiredEverywhere polls until the lock key of key is gone on every node
// (expired there), within a generous bound.
func expiredEverywhere(t *testing.T, admin []goredis.UniversalClient, key string) {
	t.Helper()
	gone := func(c goredis.UniversalClient) bool {
		n, err := c.Exists(t.Context(), lockKey(key)).Result()
		return err == nil && n == 0
	}
	if !waitFor(30*time.Second, func() bool { return countNodes(admin, gone) == len(admin) }) {
		t.Fatalf("the lock key is still on %d of %d nodes", len(admin)-countNodes(admin, gone), len(admin))
	}
}

// nextTokenWithNode0Paused acquires key with node 0 frozen (so the next
// majority is nodes 1-4 only) and returns the token.
func nextTokenWithNode0Paused(t *testing.T, ss []*servers.Server, d *redlock.Driver, key string) uint64 {
	t.Helper()
	if err := ss[0].Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ss[0].Unpause(context.WithoutCancel(t.Context())); err != nil {
			t.Error(err)
		}
	}()
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(t.Context()) }()
	return l.Token()
}

// TestRefreshShorterRaisesCounters: a Refresh to a shorter TTL moves the
// lock key's expiry earlier than the grant's, so a node whose write-back was
// skipped (its clock at the grant plus the TTL less the drift passes the
// token) could let the key expire before its clock passes the token. The
// refresh script raises the counters to the token, so the next grant, on
// those nodes only, still issues a larger token.
func TestRefreshShorterRaisesCounters(t *testing.T) {
	ss := servers.Redis(t, 5)
	admin := clients(t, addrs(ss))
	d, err := redlock.NewDriver(t.Context(), clients(t, addrs(ss)), &redlock.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"
	// Node 0's counter is 20s ahead (as its clock could be): the token
	// comes from it, within TTL − drift of the other nodes' clocks, so
	// they get no write-back.
	ahead := uint64(time.Now().Add(20 * time.Second).UnixMicro())
	if err := admin[0].Set(t.Context(), fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	majorityWith0(t, admin, key, time.Second)
	l1, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if l1.Token() != ahead+1 {
		t.Fatalf("token %d, want %d (node 0's counter + 1)", l1.Token(), ahead+1)
	}
	if _, err := l1.Refresh(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
	expiredEverywhere(t, admin, key) // the holder vanished: never released
	if next := nextTokenWithNode0Paused(t, ss, d, key); next <= l1.Token() {
		t.Errorf("after a shortened lease expired: token %d, not above %d", next, l1.Token())
	}
}

// TestExpiryAfterClockRule: a lease expires unreleased while one node's
// counter (standing for its clock) is ahead of the others' clocks, and the
// next grant, with that node paused, must issue a larger token. Within TTL
// − drift ahead, the clock rule skips the write-back to the other nodes
// (their counters stay below the token) and their clocks pass the token
// before the lock key expires there; beyond it, the write-back is due and
// lands.
func TestExpiryAfterClockRule(t *testing.T) {
	const ttl = 2 * time.Second
	ss := servers.Redis(t, 5)
	admin := clients(t, addrs(ss))
	for _, tc := range []struct {
		name      string
		ahead     time.Duration
		writeBack bool
	}{
		{"skipped", ttl / 2, false},
		{"due", 3 * ttl, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d1, err := redlock.NewDriver(t.Context(), clients(t, addrs(ss)), &redlock.Options{NodeTimeout: testNodeTimeout})
			if err != nil {
				t.Fatal(err)
			}
			key := uniqueKey(t)
			fence := lockKey(key) + ":fence"
			ahead := uint64(time.Now().Add(tc.ahead).UnixMicro())
			if err := admin[0].Set(t.Context(), fence, ahead, 0).Err(); err != nil {
				t.Fatal(err)
			}
			majorityWith0(t, admin, key, ttl/2)
			l1, err := d1.TryAcquire(t.Context(), backend.Request{Key: key, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if l1.Token() != ahead+1 {
				t.Fatalf("token %d, want %d (node 0's counter + 1)", l1.Token(), ahead+1)
			}
			expiredEverywhere(t, admin, key) // never released
			d1.Close()                       // waits for the write-backs
			raised := func(c goredis.UniversalClient) bool {
				n, err := c.Get(t.Context(), fence).Uint64()
				return err == nil && n >= l1.Token()
			}
			want := 1 // node 0
			if tc.writeBack {
				want = 3 // the granting nodes 0-2 (3 and 4 refused)
			}
			if got := countNodes(admin, raised); got != want {
				t.Errorf("%d of %d nodes' counters reached the token; want %d (write-back due: %v)", got, len(admin), want, tc.writeBack)
			}
			d2, err := redlock.NewDriver(t.Context(), clients(t, addrs(ss)), &redlock.Options{NodeTimeout: testNodeTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer d2.Close()
			if next := nextTokenWithNode0Paused(t, ss, d2, key); next <= l1.Token() {
				t.Errorf("after an unreleased lease expired: token %d, not above %d", next, l1.Token())
			}
		})
	}
}
