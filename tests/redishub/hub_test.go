package redishub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// unique returns a name no other test (or earlier run) uses.
func unique(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "redishub." + strings.ReplaceAll(t.Name(), "/", ".") + "." + hex.EncodeToString(b[:])
}

// client returns a client of addr (the test server), closed at the end
// of the test.
func client(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", addr, err)
	}
	return c
}

// numSub returns the server's count of subscribers to channel.
func numSub(t *testing.T, admin *goredis.Client, channel string) int64 {
	t.Helper()
	m, err := admin.PubSubNumSub(t.Context(), channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

// waitFor polls cond every 10ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// TestWatchSlowLinkReturnsWithContext: over a link so slow that the
// PubSub's connection cannot be made before the caller's context ends,
// Watch returns when the context ends (with an error matching both
// ErrUnavailable and the context's), not once the clean-up of its
// subscription has made a connection over the slow link; the subscription
// it started is gone from the server once the link is fast again, and the
// Hub serves again.
func TestWatchSlowLinkReturnsWithContext(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := client(t, addr)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p, err := servers.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Long read and write timeouts: over the slow link, only the Hub's own
	// bounds and the callers' contexts cut its commands short.
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	defer c.Close()
	h := redishub.New(c, unique(t)+":barrier:", "test")
	defer h.Close()
	channel := unique(t)

	// A round trip takes 4s; the PubSub's connection (dial, then the
	// HELLO handshake) takes at least one.
	const oneWay = 2 * time.Second
	p.Delay(oneWay)
	const wait = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, _, err = h.Watch(ctx, channel)
	overrun := time.Since(deadline)
	if err == nil {
		t.Fatalf("Watch over a %v round trip returned no error within %v", 2*oneWay, wait)
	}
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("Watch: %v; want an error matching ErrUnavailable", err)
	}
	// The bound is far below the round trip: a Watch that waited for a
	// command over the slow link overruns by a round trip less the wait.
	const bound = time.Second
	if overrun > bound {
		t.Errorf("Watch returned %v after its context's end (bound %v, round trip %v)", overrun.Round(time.Millisecond), bound, 2*oneWay)
	}
	t.Logf("Watch returned %v after its context's end: %v", overrun.Round(time.Millisecond), err)

	// The link is fast again: nothing is left subscribed to the channel,
	// and a Watch is confirmed and woken by a message.
	p.Heal()
	if !waitFor(20*time.Second, func() bool { return numSub(t, admin, channel) == 0 }) {
		t.Errorf("the failed Watch left a subscription to %q", channel)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	wake, stop, err := h.Watch(wctx, channel)
	if err != nil {
		t.Fatalf("Watch after the link healed: %v", err)
	}
	if err := admin.Publish(t.Context(), channel, "x").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Errorf("no wake-up within 10s of a message")
	}
	stop()
	if !waitFor(10*time.Second, func() bool { return numSub(t, admin, channel) == 0 }) {
		t.Errorf("the channel is still subscribed after its only watcher stopped")
	}
	h.Close()
	_ = c.Close()
	_ = p.Close()
}

// TestWatchStopOrder: a channel watched, stopped and watched again many
// times in a row ends subscribed (the UNSUBSCRIBE of a stop never reaches
// the server after the SUBSCRIBE of the next Watch), and the last watcher
// is woken by a message.
func TestWatchStopOrder(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := client(t, addr)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	h := redishub.New(c, unique(t)+":barrier:", "test")
	defer h.Close()
	channel := unique(t)
	for range 50 {
		_, stop, err := h.Watch(t.Context(), channel)
		if err != nil {
			t.Fatal(err)
		}
		stop()
	}
	wake, stop, err := h.Watch(t.Context(), channel)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if n := numSub(t, admin, channel); n != 1 {
		t.Errorf("after Watch returned, %d subscribers to the channel; want 1", n)
	}
	if err := admin.Publish(t.Context(), channel, "x").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Errorf("no wake-up within 10s of a message")
	}
}

// TestWatchClosed: Watch on a closed Hub returns ErrClosed, and Close
// closes the wake channels of the watchers.
func TestWatchClosed(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	h := redishub.New(c, unique(t)+":barrier:", "test")
	wake, stop, err := h.Watch(t.Context(), unique(t))
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, ok := <-wake; ok {
		t.Errorf("wake not closed by Close")
	}
	stop()
	if _, _, err := h.Watch(t.Context(), unique(t)); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Watch after Close: %v; want ErrClosed", err)
	}
}
