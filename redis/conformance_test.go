package redis_test

import (
	"context"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/redis"
)

// harness runs the conformance suite on the package's Redis container.
// Each Locker gets its own client, as a separate process would.
type harness struct {
	admin *goredis.Client

	mu      sync.Mutex
	clients []*goredis.Client
}

func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	c := goredis.NewClient(&goredis.Options{Addr: h.admin.Options().Addr})
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

func (h *harness) Expire(ctx context.Context, key string) error {
	return h.admin.Del(ctx, lockKey(key)).Err()
}

// Residue reports a lock key or a live subscription to its release channel
// (a waiter that did not stop watching).
func (h *harness) Residue(ctx context.Context, key string) (bool, error) {
	n, err := h.admin.Exists(ctx, lockKey(key)).Result()
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
