package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/servers"
	"github.com/dlock-go/dlock/redis"
)

// startSentinel starts a primary, replica and Sentinel of the test's own,
// terminated when the test ends; it skips the test where they need host
// networking and do not have it.
func startSentinel(t *testing.T) *servers.RedisSentinel {
	t.Helper()
	r, err := servers.StartRedisSentinel(t.Context())
	if errors.Is(err, servers.ErrNeedsHostNetwork) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Terminate(context.WithoutCancel(t.Context())) })
	return r
}

// TestSentinelFailover runs the backend through go-redis failover clients
// (Sentinel) and kills the primary while a lock is held, taken with
// WaitReplicas 1. Sentinel promotes the replica; the lock is still held
// there (its acquire waited for the replica), the holder releases it on the
// new primary, and the next holder's token is larger (the counter's
// increment had reached the replica too). The next holder does not wait
// for replicas: after the failover there are none.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	r := startSentinel(t)
	newLocker := func(waitReplicas int) *dlock.Locker {
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            r.MasterName,
			SentinelAddrs:         []string{r.Sentinel.Addr()},
			ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { _ = c.Close() })
		l, err := redis.New(t.Context(), c, &redis.Options{WaitReplicas: waitReplicas})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := newLocker(1), newLocker(0)
	key := uniqueKey(t)
	ao := &dlock.AcquireOptions{TTL: time.Minute}
	la, err := a.TryAcquire(t.Context(), key, ao)
	if err != nil {
		t.Fatalf("TryAcquire with WaitReplicas 1: %v", err)
	}

	if err := r.Primary.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Until the replica is promoted, attempts fail; afterwards the lock
	// is found held.
	begin := time.Now()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		_, err := b.TryAcquire(ctx, key, ao)
		timedOut := ctx.Err() != nil
		cancel()
		if errors.Is(err, dlock.ErrNotAcquired) && !timedOut {
			break // held (a timed-out attempt matches ErrNotAcquired too)
		}
		if err == nil {
			t.Fatal("after the failover the lock was granted to a second holder: the new primary lost it")
		}
		if time.Since(begin) > 30*time.Second {
			t.Fatalf("no failover within 30s; last attempt: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("failover: the lock was found held on the new primary after %v", time.Since(begin).Round(time.Millisecond))

	if err := la.Release(t.Context()); err != nil {
		t.Fatalf("Release on the new primary: %v", err)
	}
	lb, err := b.TryAcquire(t.Context(), key, ao)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token after the failover %d, not above %d", lb.Token(), la.Token())
	}
	if err := lb.Release(t.Context()); err != nil {
		t.Errorf("Release: %v", err)
	}
}
