package redis_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// serverAddr returns the address of the package's Redis server, a container
// started on first use (see tests/servers). It has no replicas; the
// tests change its maxmemory-policy briefly and flush its script cache.
func serverAddr(tb testing.TB) string {
	tb.Helper()
	return servers.Redis(tb, 1)[0].Addr()
}

// serverClient returns a client of the test server, closed at the end of
// the test.
func serverClient(tb testing.TB) *goredis.Client {
	tb.Helper()
	addr := serverAddr(tb)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(tb.Context()).Err(); err != nil {
		tb.Fatalf("Redis at %s: %v", addr, err)
	}
	return c
}

// newDriver returns a driver over c, closed at the end of the test.
func newDriver(tb testing.TB, c goredis.UniversalClient, opts *redis.Options) *redis.Driver {
	tb.Helper()
	d, err := redis.NewDriver(tb.Context(), c, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

// uniqueKey returns a key no other test (or earlier run) uses.
func uniqueKey(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}

func lockKey(key string) string { return redis.DefaultPrefix + "{" + key + "}" }

func TestTokensIncrease(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d1, d2 := newDriver(t, c, nil), newDriver(t, c, nil)
	key := uniqueKey(t)
	var last uint64
	for i := range 20 {
		d := d1
		if i%2 == 1 {
			d = d2
		}
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d not above the previous %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// grant takes and releases the lock on key through d, and returns the token.
func grant(t *testing.T, d *redis.Driver, key string) uint64 {
	t.Helper()
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	return l.Token()
}

func TestTokenSurvivesCounterLoss(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"

	t1 := grant(t, d, key)
	// The counter is lost (restart without persistence, failover, DEL).
	if err := c.Del(t.Context(), fence).Err(); err != nil {
		t.Fatal(err)
	}
	t2 := grant(t, d, key)
	if t2 <= t1 {
		t.Fatalf("after losing the counter: token %d, not above the previous %d", t2, t1)
	}
	// A counter ahead of the clock (tokens issued in a burst, or by a
	// server with a faster clock) still gives counter+1.
	ahead := t2 + 1e12
	if err := c.Set(t.Context(), fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if t3 := grant(t, d, key); t3 != ahead+1 {
		t.Fatalf("counter %d ahead of the clock: token %d, want %d", ahead, t3, ahead+1)
	}
	if ttl := c.PTTL(t.Context(), fence).Val(); ttl != -1 {
		t.Fatalf("counter key PTTL = %v, want no expiry", ttl)
	}
}

// TestTokenBelowEarlierWhenClockBehind pins down the documented residual of
// best-effort fencing. A counter that lags (restored from a snapshot, or a
// replica that missed the last increments) no longer repeats tokens: the
// server clock is under every token. What remains is a counter that lags
// while the server clock also reads behind the earlier tokens (they came
// from a server whose clock was ahead, or this clock was stepped back by
// more than the time since): then the token goes back. If this test fails,
// the package documentation overstates the risk.
func TestTokenBelowEarlierWhenClockBehind(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"
	t1 := grant(t, d, key)
	// A lagging counter: the token is the clock, above every earlier one.
	t2 := grant(t, d, key)
	if err := c.Set(t.Context(), fence, t1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	t3 := grant(t, d, key)
	if t3 <= t2 {
		t.Fatalf("after the counter fell back to %d: token %d, not above the earlier %d", t1, t3, t2)
	}
	// A grant by a server whose clock was an hour ahead, then a lagging
	// counter on this one: the token goes back to this server's clock.
	ahead := t3 + uint64(time.Hour/time.Microsecond)
	if err := c.Set(t.Context(), fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	t4 := grant(t, d, key)
	if t4 != ahead+1 {
		t.Fatalf("counter %d ahead of the clock: token %d, want %d", ahead, t4, ahead+1)
	}
	if err := c.Set(t.Context(), fence, t3, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if t5 := grant(t, d, key); t5 >= t4 || t5 <= t3 {
		t.Fatalf("clock behind an earlier token %d, counter back at %d: token %d; want the server clock, between them, as the docs describe", t4, t3, t5)
	}
}

func TestHeldAndOwnership(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)

	// Sub-millisecond parts are truncated and reported.
	l, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: 20*time.Second + 1500*time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.TTL(), 20*time.Second+time.Millisecond; got != want {
		t.Errorf("TTL() = %v, want %v", got, want)
	}

	_, err = d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Second})
	var held *backend.HeldError
	if !errors.As(err, &held) || !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v, want a HeldError", err)
	}
	if held.RetryAfter <= 19*time.Second || held.RetryAfter > 20*time.Second+time.Millisecond {
		t.Errorf("RetryAfter = %v, want about 20s", held.RetryAfter)
	}

	got, err := l.Refresh(ctx, 5*time.Second+999*time.Microsecond)
	if err != nil || got != 5*time.Second {
		t.Fatalf("Refresh = %v, %v; want 5s", got, err)
	}
	if pttl := c.PTTL(ctx, lockKey(key)).Val(); pttl <= 4*time.Second || pttl > 5*time.Second {
		t.Errorf("PTTL after Refresh = %v", pttl)
	}

	// Someone else's value under the key: neither refresh nor release
	// touches it.
	if err := c.Set(ctx, lockKey(key), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Refresh(ctx, time.Hour); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh of a stolen lock = %v, want ErrNotHeld", err)
	}
	if err := l.Release(ctx); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of a stolen lock = %v, want ErrNotHeld", err)
	}
	if v := c.Get(ctx, lockKey(key)).Val(); v != "someone-else" {
		t.Errorf("the other holder's value became %q", v)
	}
	if pttl := c.PTTL(ctx, lockKey(key)).Val(); pttl > time.Minute {
		t.Errorf("the other holder's TTL became %v", pttl)
	}
	c.Del(ctx, lockKey(key))

	// Refresh never re-creates a missing key; double release is ErrNotHeld.
	l, err = d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("second Release = %v, want ErrNotHeld", err)
	}
	if _, err := l.Refresh(ctx, time.Minute); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after Release = %v, want ErrNotHeld", err)
	}
	if n := c.Exists(ctx, lockKey(key)).Val(); n != 0 {
		t.Errorf("Refresh re-created the key")
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l2, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Second})
		if err == nil {
			if l2.Token() <= l.Token() {
				t.Errorf("token after expiry %d, not above %d", l2.Token(), l.Token())
			}
			if err := l.Release(t.Context()); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Release of an expired lease = %v, want ErrNotHeld", err)
			}
			_ = l2.Release(t.Context())
			return
		}
		if !errors.Is(err, backend.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire after expiry = %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestScriptCacheFlushed(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	if err := c.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, &redis.Options{WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	key := uniqueKey(t)
	// With the script cache flushed, the pipeline's EVALSHA meets NOSCRIPT
	// and is sent again as EVAL: the error must still be WAIT's.
	if err := c.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "WAIT: 0 of 1 replicas acknowledged") {
		t.Fatalf("TryAcquire with WaitReplicas 1 and no replica = %v", err)
	}
	if n := c.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
		t.Fatalf("the lock key is left behind after a failed WAIT")
	}

	// Held: the HeldError comes through the pipeline too.
	l, err := newDriver(t, c, nil).TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	var held *backend.HeldError
	if _, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute}); !errors.As(err, &held) {
		t.Fatalf("TryAcquire of a held key with WaitReplicas = %v, want HeldError", err)
	}
}

func TestWatchWakesOnRelease(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	holder, waiter := newDriver(t, c, nil), newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)

	for round := range 3 { // the channel is unsubscribed and subscribed again each round
		l, err := holder.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		wake1, stop1, err := waiter.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		wake2, stop2, err := waiter.Watch(ctx, key) // a second watcher of the same key
		if err != nil {
			t.Fatal(err)
		}
		other, stopOther, err := waiter.Watch(ctx, uniqueKey(t))
		if err != nil {
			t.Fatal(err)
		}
		// The attempt after Watch marks the lock as waited for.
		var held *backend.HeldError
		if _, err := waiter.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute}); !errors.As(err, &held) {
			t.Fatalf("round %d: TryAcquire of a held key = %v, want HeldError", round, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i, w := range []<-chan struct{}{wake1, wake2} {
			select {
			case <-w:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: watcher %d not woken by the release", round, i+1)
			}
		}
		select {
		case <-other:
			t.Errorf("round %d: a watcher of another key was woken", round)
		default:
		}
		stop1()
		stop2()
		stopOther()
	}
}

// TestReleasePublishesOnlyWhenWaitedFor: an uncontended release is a plain
// compare-and-delete; a failed acquire marks the lock, and then the release
// is published. A sentinel message published by the test after each
// release shows, by arriving first, that the release published nothing.
func TestReleasePublishesOnlyWhenWaitedFor(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	channel := lockKey(key) + ":released"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := ps.ReceiveMessage(rctx)
		if err != nil {
			t.Fatal(err)
		}
		return m.Payload
	}
	for _, waited := range []bool{false, true, false} {
		l, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if waited {
			for range 2 { // the second attempt finds the mark and keeps it
				if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute}); !errors.Is(err, backend.ErrNotAcquired) {
					t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err)
				}
			}
			if v := c.Get(ctx, lockKey(key)).Val(); !strings.HasSuffix(v, "+") || strings.HasSuffix(v, "++") {
				t.Fatalf("value after two failed attempts = %q, want one '+' appended", v)
			}
			// The holder still owns the marked lock.
			if _, err := l.Refresh(ctx, time.Minute); err != nil {
				t.Fatalf("Refresh of a marked lock = %v", err)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(ctx, channel, "sentinel").Err(); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), map[bool]string{false: "sentinel", true: "1"}[waited]; got != want {
			t.Fatalf("waited=%v: first message after the release = %q, want %q", waited, got, want)
		}
		if waited && next() != "sentinel" {
			t.Fatal("the sentinel did not follow the release message")
		}
	}
}

func TestWatchCancelled(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := d.Watch(ctx, uniqueKey(t)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with a cancelled context = %v", err)
	}
}

func TestLockerHandoff(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	l, err := redis.New(t.Context(), c, &redis.Options{Locker: &dlock.Options{RetryMax: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := uniqueKey(t)
	ctx := t.Context()
	lease, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// With RetryMax a minute and the holder's lease a minute, the waiter can
	// only get the lock well within the bound below if the release wakes it.
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l2, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: time.Minute})
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the waiter start waiting (not needed for correctness)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestOpenURL(t *testing.T) {
	t.Parallel()
	serverClient(t)
	l, err := dlock.Open(t.Context(), "redis://"+serverAddr(t)+"?ttl=5s&prefix=dlocktest:&eviction_check=refuse")
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if lease.TTL() != 5*time.Second {
		t.Errorf("TTL = %v, want the URL's 5s", lease.TTL())
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// The tests below are not parallel: they change server-wide settings or
// count goroutines. Go runs them before resuming the parallel tests.

func TestEvictionCheck(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	old := c.ConfigGet(ctx, "maxmemory-policy").Val()["maxmemory-policy"]
	if old == "" {
		t.Skip("CONFIG GET is not available on the test server")
	}
	t.Cleanup(func() { c.ConfigSet(context.Background(), "maxmemory-policy", old) })
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}

	_, err := redis.NewDriver(ctx, c, nil)
	if !errors.Is(err, backend.ErrInvalidConfig) || !strings.Contains(err.Error(), "CONFIG SET maxmemory-policy noeviction") {
		t.Fatalf("NewDriver under allkeys-lru = %v, want ErrInvalidConfig naming the fix", err)
	}
	if logged := evictionWarnLog(t, c); !strings.Contains(logged, "allkeys-lru") {
		t.Errorf("EvictionWarn logged %q", logged)
	}
	d, err := redis.NewDriver(ctx, c, &redis.Options{EvictionCheck: redis.EvictionIgnore})
	if err != nil {
		t.Fatalf("NewDriver with EvictionIgnore = %v", err)
	}
	_ = d.Close()
	if _, err := dlock.Open(ctx, "redis://"+serverAddr(t)); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Fatalf("Open under allkeys-lru = %v, want ErrInvalidConfig", err)
	}
}

// TestEvictionCheckUnreadable: a user that may not run CONFIG (an ACL, as on
// managed services; a renamed CONFIG command behaves alike) cannot check
// the eviction policy. The default EvictionRefuse then refuses to open,
// saying what to do; EvictionWarn warns and EvictionIgnore does not ask.
func TestEvictionCheckUnreadable(t *testing.T) {
	t.Parallel()
	admin := serverClient(t)
	ctx := t.Context()
	var b [8]byte
	_, _ = rand.Read(b[:])
	user, pass := "dlock-noconfig-"+hex.EncodeToString(b[:4]), hex.EncodeToString(b[4:])
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.WithoutCancel(ctx), "ACL", "DELUSER", user) })
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t), Username: user, Password: pass})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil {
		t.Fatal("the restricted user can run CONFIG GET: the test shows nothing")
	}

	_, err := redis.NewDriver(ctx, c, nil)
	if !errors.Is(err, backend.ErrInvalidConfig) || !strings.Contains(err.Error(), "CONFIG GET") ||
		!strings.Contains(err.Error(), "EvictionCheck to warn or ignore") {
		t.Fatalf("NewDriver without CONFIG GET = %v; want ErrInvalidConfig saying to allow CONFIG GET or set EvictionCheck", err)
	}
	u := "redis://" + user + ":" + pass + "@" + serverAddr(t)
	if l, err := dlock.Open(ctx, u); !errors.Is(err, dlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "eviction_check") {
		if l != nil {
			_ = l.Close()
		}
		t.Fatalf("Open without CONFIG GET = %v; want ErrInvalidConfig naming eviction_check", err)
	}

	if logged := evictionWarnLog(t, c); !strings.Contains(logged, "cannot check maxmemory-policy") {
		t.Errorf("EvictionWarn logged %q", logged)
	}
	l, err := dlock.Open(ctx, u+"?eviction_check=ignore")
	if err != nil {
		t.Fatalf("Open with eviction_check=ignore = %v", err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, uniqueKey(t), nil)
	if err != nil {
		t.Fatalf("TryAcquire as the restricted user: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// evictionWarnLog makes (and closes) a driver on c with EvictionWarn and
// returns what it logged.
func evictionWarnLog(t *testing.T, c *goredis.Client) string {
	t.Helper()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	d, err := redis.NewDriver(t.Context(), c, &redis.Options{EvictionCheck: redis.EvictionWarn, Locker: &dlock.Options{Logger: log}})
	if err != nil {
		t.Fatalf("NewDriver with EvictionWarn = %v", err)
	}
	_ = d.Close()
	mu.Lock()
	defer mu.Unlock()
	return buf.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	c := serverClient(t) // its pool is in use already: not ours to count
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	d, err := redis.NewDriver(t.Context(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	l, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	wake, stop, err := d.Watch(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	_, stop2, err := d.Watch(t.Context(), uniqueKey(t))
	if err != nil {
		t.Fatal(err)
	}
	stop2()
	if _, err := d.TryAcquire(t.Context(), backend.Request{Key: key, TTL: time.Minute}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err) // and marks it waited for
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-wake
	// Close with a watcher still registered: its channel is closed.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-wake; ok {
		t.Errorf("wake channel still open after Close")
	}
	stop()
	if _, _, err := d.Watch(t.Context(), key); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Watch after Close = %v, want ErrClosed", err)
	}
}

// TestOpenForCorrectness: a single Redis cannot serve locks that protect
// data; the error says why and what to use, and the loudly named override
// opens it anyway.
func TestOpenForCorrectness(t *testing.T) {
	u := "redis://" + serverAddr(t)
	_, err := dlock.Open(t.Context(), u+"?purpose=correctness")
	if !errors.Is(err, dlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "etcd or ZooKeeper") {
		t.Fatalf("Open for correctness = %v; want ErrInvalidConfig naming etcd or ZooKeeper", err)
	}
	// Refused before any I/O: an unreachable address gives the same
	// error, at once.
	start := time.Now()
	_, err = dlock.Open(t.Context(), "redis://127.0.0.1:1?purpose=correctness")
	if !errors.Is(err, dlock.ErrInvalidConfig) || time.Since(start) > time.Second {
		t.Errorf("Open for correctness of an unreachable Redis = %v after %v; want ErrInvalidConfig at once", err, time.Since(start))
	}
	for _, ok := range []string{u + "?purpose=efficiency", u + "?purpose=correctness&unsafe_accept_clock_dependent_lock=true"} {
		l, err := dlock.Open(t.Context(), ok)
		if err != nil {
			t.Fatalf("Open(%q): %v", ok, err)
		}
		_ = l.Close()
	}
}

// TestTokensExactBeyond2To53: tokens stay exact and increasing once the
// counter passes 2^53, where a Lua number (a double) can no longer tell
// neighbouring integers apart.
func TestTokensExactBeyond2To53(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	const start = 1<<53 + 2
	if err := c.Set(t.Context(), lockKey(key)+":fence", uint64(start), 0).Err(); err != nil {
		t.Fatal(err)
	}
	last := uint64(start)
	for i := range 4 {
		tok := grant(t, d, key)
		if tok != last+1 {
			t.Fatalf("grant %d with the counter at %d: token %d, want %d", i, last, tok, last+1)
		}
		last = tok
	}
	if got, err := c.Get(t.Context(), lockKey(key)+":fence").Uint64(); err != nil || got != last {
		t.Fatalf("counter = %d, %v; want %d", got, err, last)
	}
}
