package redis_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// TestFenceCounterExpires: a grant whose token is the server clock lets
// the lock's fencing counter expire FenceRetention after the lock's TTL, so
// counter keys do not pile up (one per lock name, forever); the next grant,
// counter gone, still issues a larger token (the clock).
func TestFenceCounterExpires(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	const ttl, retention = 300 * time.Millisecond, 200 * time.Millisecond
	d := newDriver(t, c, &redis.Options{FenceRetention: retention})
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"

	var last uint64
	for i := range 2 {
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d, not above the previous %d (the counter expired in between)", i, l.Token(), last)
		}
		last = l.Token()
		pttl, err := c.PTTL(t.Context(), fence).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl <= 0 || pttl > ttl+retention {
			t.Fatalf("grant %d: counter PTTL %v, want in (0, %v]", i, pttl, ttl+retention)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// Gone after the lock's TTL + the retention (polled, generous
		// bound: Redis expires keys lazily or in its active cycle).
		deadline := time.Now().Add(30 * time.Second)
		for {
			n, err := c.Exists(t.Context(), fence).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("grant %d: the counter key is still there 30s after the lock ended (PTTL %v)", i, c.PTTL(t.Context(), fence).Val())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestFenceCounterRetention: the counter's expiry follows Options:
// the lock's TTL + DefaultFenceRetention by default, none with a negative
// FenceRetention, and none while the counter is ahead of the clock (it
// alone orders the tokens until the clock passes it), until a grant's
// token is the clock again.
func TestFenceCounterRetention(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	const ttl = 10 * time.Second
	pttl := func(key string) time.Duration {
		t.Helper()
		v, err := c.PTTL(t.Context(), lockKey(key)+":fence").Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	grantTTL := func(d *redis.Driver, key string) uint64 {
		t.Helper()
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		return l.Token()
	}

	t.Run("default", func(t *testing.T) {
		key := uniqueKey(t)
		grantTTL(newDriver(t, c, nil), key)
		if got, want := pttl(key), ttl+redis.DefaultFenceRetention; got <= want-time.Minute || got > want {
			t.Fatalf("counter PTTL %v, want about %v", got, want)
		}
	})
	t.Run("never", func(t *testing.T) {
		key := uniqueKey(t)
		grantTTL(newDriver(t, c, &redis.Options{FenceRetention: -1}), key)
		if got := pttl(key); got != -1 {
			t.Fatalf("FenceRetention < 0: counter PTTL %v, want -1 (no expiry)", got)
		}
	})
	t.Run("ahead", func(t *testing.T) {
		d := newDriver(t, c, &redis.Options{FenceRetention: time.Millisecond})
		key := uniqueKey(t)
		t1 := grantTTL(d, key)
		if got := pttl(key); got <= 0 {
			t.Fatalf("token from the clock: counter PTTL %v, want an expiry", got)
		}
		// A counter ahead of the clock (a server with a faster clock, a
		// counter set by hand): kept, with no expiry, however short the
		// retention.
		ahead := t1 + uint64(time.Hour/time.Microsecond)
		if err := c.Set(t.Context(), lockKey(key)+":fence", ahead, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if tok := grantTTL(d, key); tok != ahead+1+uint64(i) {
				t.Fatalf("counter ahead of the clock: token %d, want %d", tok, ahead+1+uint64(i))
			}
			if got := pttl(key); got != -1 {
				t.Fatalf("counter ahead of the clock: PTTL %v, want -1 (kept)", got)
			}
		}
		// Once the counter is behind the clock again (here: set back),
		// the next grant's token is the clock and the counter expires.
		if err := c.Set(t.Context(), lockKey(key)+":fence", t1, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if tok := grantTTL(d, key); tok <= t1 {
			t.Fatalf("counter behind the clock: token %d, not above %d", tok, t1)
		}
		if got := pttl(key); got <= 0 {
			t.Fatalf("token from the clock again: counter PTTL %v, want an expiry", got)
		}
	})
}
