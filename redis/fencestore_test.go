package redis_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/redis"
)

// TestFenceStoreChecksInput: redis.FenceStore refuses token 0, an empty
// key, a missing client and a *goredis.Ring as fence's own stores do, with
// ErrInvalidConfig and before any I/O. The client points at a port nothing
// serves: a Set that reached Redis would fail with ErrUnavailable instead,
// and would have dialled.
func TestFenceStoreChecksInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rc := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr}, MaxRetries: -1})
	defer ring.Close()
	var _ fence.Store = redis.FenceStore{}
	for _, c := range []struct {
		what  string
		store redis.FenceStore
		key   string
		token dlock.Token
	}{
		{"token 0", redis.FenceStore{Client: rc}, "k", 0},
		{"empty key", redis.FenceStore{Client: rc}, "", 7},
		{"no client", redis.FenceStore{}, "k", 7},
		{"a Ring", redis.FenceStore{Client: ring}, "k", 7},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := c.store.Set(ctx, c.key, "v", c.token)
		cancel()
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v; want ErrInvalidConfig", c.what, err)
		}
	}
	if n := rc.PoolStats().TotalConns; n != 0 {
		t.Errorf("%d connections made for refused input", n)
	}
}
