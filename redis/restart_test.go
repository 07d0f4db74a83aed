package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conformance/servers"
)

// TestTokenAfterLossyRestart: a Redis that persists by RDB snapshots
// crashes (kill -9) after grants that the last snapshot does not hold, and
// comes back with the counter as the snapshot had it, and without the lock
// that was held at the crash. The next grant (a second holder, the
// documented unsafety of a restart) must still get a token above every
// earlier one: the script puts the server clock under every token, so a
// stale counter cannot hand out earlier tokens again.
func TestTokenAfterLossyRestart(t *testing.T) {
	t.Parallel()
	// Snapshots at most hourly (none during the test but the explicit
	// SAVE below), in a directory the server can write.
	ss, err := servers.StartRedisWithArgs(t.Context(), 1, "--dir", "/tmp", "--save", "3600 1", "--appendonly", "no")
	if err != nil {
		t.Fatalf("starting Redis with persistence: %v", err)
	}
	s := ss[0]
	t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(t.Context())) })
	connect := func() *goredis.Client {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := t.Context()
	c := connect()
	d := newDriver(t, c, nil)
	key := uniqueKey(t)
	fence := lockKey(key) + ":fence"

	var last uint64
	take := func() {
		t.Helper()
		tok := grant(t, d, key)
		if tok <= last {
			t.Fatalf("token %d not above the previous %d", tok, last)
		}
		last = tok
	}
	for range 3 {
		take()
	}
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	saved, err := c.Get(ctx, fence).Uint64()
	if err != nil {
		t.Fatal(err)
	}
	// Grants the snapshot does not hold, and a lock held at the crash.
	for range 3 {
		take()
	}
	held, err := d.TryAcquire(ctx, key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if held.Token() <= last {
		t.Fatalf("token %d not above the previous %d", held.Token(), last)
	}
	last = held.Token()

	if err := s.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c2 := connect() // in bridge mode the address may have changed
	// The loss is real: the counter is back at the snapshot's value,
	// below the last token, and the held lock is gone.
	restored, err := c2.Get(ctx, fence).Uint64()
	if err != nil {
		t.Fatalf("the counter after the restart: %v (did the snapshot load?)", err)
	}
	if restored != saved || restored >= last {
		t.Fatalf("after the restart the counter is %d; want the snapshot's %d, below the last token %d (no loss, the test shows nothing)",
			restored, saved, last)
	}
	if n := c2.Exists(ctx, lockKey(key)).Val(); n != 0 {
		t.Fatal("the lock held at the crash survived the restart: no loss, the test shows nothing")
	}

	d2 := newDriver(t, c2, nil)
	l, err := d2.TryAcquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire after the restart: %v", err)
	}
	if l.Token() <= last {
		t.Fatalf("after a lossy restart: token %d, not above the %d of the holder the crash forgot (counter restored at %d)",
			l.Token(), last, restored)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
