package redis_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// TestWaitReplicasNotBypassed: with WaitReplicas 1 and the only replica
// frozen (it cannot acknowledge anything), no acquire may return a lease,
// however go-redis resends the acquire script and WAIT.
func TestWaitReplicasNotBypassed(t *testing.T) {
	t.Parallel()
	r := startSentinel(t)
	admin := goredis.NewClient(&goredis.Options{Addr: r.Primary.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	if err := r.Replica.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Replica.Unpause(context.WithoutCancel(t.Context())) })
	const waitTimeout = 200 * time.Millisecond
	noLease := func(t *testing.T, d *redis.Driver, key string) error {
		t.Helper()
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
		if err == nil {
			t.Fatalf("a lease (token %d) with WaitReplicas 1 although the only replica is frozen and acknowledged nothing", l.Token())
		}
		if n := admin.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
			t.Errorf("the lock key is left behind after the failed acquire")
		}
		return err
	}

	// The plain case: WAIT times out, the lock is released.
	t.Run("frozen replica", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: r.Primary.Addr(), ReadTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		d := newDriver(t, c, &redis.Options{WaitReplicas: 1, WaitTimeout: waitTimeout})
		if err := noLease(t, d, uniqueKey(t)); !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("TryAcquire = %v, want ErrUnavailable", err)
		}
	})

	// The reply to the acquire + WAIT pipeline never comes (a network
	// failure after the server took the lock): the read times out and
	// go-redis resends the pipeline on a new connection. The resent script
	// finds the lock its own; it must still write, so that WAIT on the new
	// connection waits for the replica instead of counting it at once.
	// (Redis 7.2 and later count for WAIT only the connection's own
	// writes; before 7.2 any command made WAIT cover every write so far,
	// and this case passes without the fix too. With a Redis 8.0 server,
	// DLOCK_REDIS_IMAGE, it fails without it.)
	t.Run("pipeline resent after a read timeout", func(t *testing.T) {
		if v := redisVersion(t, admin); v[0] < 7 || v[0] == 7 && v[1] < 2 {
			msg := fmt.Sprintf("the server is Redis %d.%d: this case can only fail on 7.2 or later (set DLOCK_REDIS_IMAGE)", v[0], v[1])
			if os.Getenv("DLOCK_REQUIRE_SERVERS") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		p := newReplyDropperTo(t, r.Primary.Addr())
		p.hold = true
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ReadTimeout: time.Second,
			MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		d := newDriver(t, c, &redis.Options{WaitReplicas: 1, WaitTimeout: waitTimeout})
		p.armed.Store(true)
		err := noLease(t, d, uniqueKey(t))
		if p.armed.Load() {
			t.Fatal("the proxy never saw the acquire script")
		}
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("TryAcquire = %v, want ErrUnavailable", err)
		}
		t.Logf("TryAcquire = %v", err)
	})

	// A WaitTimeout the client's ReadTimeout cuts short: every WAIT reply
	// times out the read and go-redis resends the pipeline. Refused before
	// any I/O.
	t.Run("WaitTimeout not below ReadTimeout", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: r.Primary.Addr(), ReadTimeout: 300 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		d, err := redis.NewDriver(t.Context(), c, &redis.Options{WaitReplicas: 1, WaitTimeout: time.Second})
		if err == nil {
			t.Cleanup(func() { _ = d.Close() })
			err := noLease(t, d, uniqueKey(t))
			t.Fatalf("NewDriver accepted WaitTimeout 1s with ReadTimeout 300ms (TryAcquire: %v); want ErrInvalidConfig", err)
		}
		if !errors.Is(err, backend.ErrInvalidConfig) {
			t.Fatalf("NewDriver = %v, want ErrInvalidConfig", err)
		}
	})
}

// redisVersion returns the server's major and minor version.
func redisVersion(t *testing.T, c *goredis.Client) [2]int {
	t.Helper()
	info, err := c.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			var major, minor int
			if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
				t.Fatalf("redis_version %q: %v", v, err)
			}
			return [2]int{major, minor}
		}
	}
	t.Fatalf("no redis_version in INFO server")
	return [2]int{}
}
