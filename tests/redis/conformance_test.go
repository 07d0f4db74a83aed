package redis_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// harness runs the conformance suite on a Redis container. Each Locker
// gets its own client, as a separate process would: a plain client, or the
// one newClient makes.
type harness struct {
	admin     *goredis.Client
	newClient func() goredis.UniversalClient

	mu      sync.Mutex
	clients []goredis.UniversalClient
}

func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	var c goredis.UniversalClient
	if h.newClient != nil {
		c = h.newClient()
	} else {
		c = goredis.NewClient(&goredis.Options{Addr: h.admin.Options().Addr})
	}
	l, err := redis.New(ctx, c, &redis.Options{Locker: opts})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	h.mu.Lock()
	h.clients = append(h.clients, c)
	h.mu.Unlock()
	return l, nil
}

// Expire drops every lease on key: an exclusive lock, or all shared
// leases (the lock key, its holders and their tokens), as
// memory.Store.Expire does.
func (h *harness) Expire(ctx context.Context, key string) error {
	return h.admin.Del(ctx, sharedKeys(key)...).Err()
}

// sharedKeys returns key's lock key and the holders and tokens keys of
// its shared leases (see the redis package documentation, Shared leases).
func sharedKeys(key string) []string {
	lk := lockKey(key)
	return []string{lk, lk + ":holders", lk + ":tokens"}
}

// Residue reports a lock key (a holder, exclusive or shared, or a key
// reserved for a waiting writer), shared holders or their tokens, or a live
// subscription to its release channel (a waiter that did not stop
// watching).
func (h *harness) Residue(ctx context.Context, key string) (bool, error) {
	n, err := h.admin.Exists(ctx, sharedKeys(key)...).Result()
	if err != nil || n > 0 {
		return n > 0, err
	}
	// An UNSUBSCRIBE sent just before may still be on its way on the
	// pub/sub connection: allow it a moment.
	ch := lockKey(key) + ":released"
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		subs, err := h.admin.PubSubNumSub(ctx, ch).Result()
		if err != nil || subs[ch] == 0 || time.Now().After(deadline) {
			return subs[ch] > 0, err
		}
	}
}

func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.clients {
		_ = c.Close()
	}
	_ = h.admin.Close()
}

func TestConformance(t *testing.T) {
	addr := serverAddr(t)
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{admin: goredis.NewClient(&goredis.Options{Addr: addr})}, nil
	})
}

// TestConformanceCluster runs the suite through go-redis ClusterClients on a
// server in cluster mode, which refuses (CROSSSLOT) a script whose lock and
// counter keys are not in one hash slot.
func TestConformanceCluster(t *testing.T) {
	s, err := servers.StartRedisCluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(t.Context())) })
	addr := s.Addr()
	// The one node serves every slot (see servers.StartRedisCluster).
	slots := func(context.Context) ([]goredis.ClusterSlot, error) {
		return []goredis.ClusterSlot{{Start: 0, End: 16383, Nodes: []goredis.ClusterNode{{Addr: addr}}}}, nil
	}
	newClient := func() goredis.UniversalClient {
		return goredis.NewClusterClient(&goredis.ClusterOptions{ClusterSlots: slots})
	}
	probe := newClient()
	defer probe.Close()
	lk := lockKey("crossslot-probe")
	err = probe.Eval(t.Context(), "return redis.call('GET', KEYS[1])", []string{lk, "elsewhere"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("a script over two slots = %v; want CROSSSLOT (is the server in cluster mode?)", err)
	}
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{admin: goredis.NewClient(&goredis.Options{Addr: addr}), newClient: newClient}, nil
	})
	t.Run("RefreshBatch", func(t *testing.T) {
		c, admin := newClient(), goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close(); _ = admin.Close() })
		testRefreshBatch(t, c, admin, 49) // one script per lease
	})
}
