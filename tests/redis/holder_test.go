package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// The lock value carries the holder description before the ownership part
// (issue 23), so a holder ending with '+' (the waited-for mark,
// acquire.lua) does not pass for a mark: a failed acquire still marks the
// lock, Inspect still reports the holder whole, the holder still owns the
// marked lock, and its release is published to wake the waiters. Seen
// failing with the value laid out as ownership part + holder: the lock was
// never marked (its value already ended with '+'), Inspect reported "C+",
// and the release published nothing (the sentinel came first).
func TestHolderEndingWithMark(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	key := uniqueKey(t)
	const holder = "C++"
	channel := lockKey(key) + ":released"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	l, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute, Holder: holder})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, backend.Request{Key: key, TTL: time.Minute}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err)
	}
	if v := c.Get(ctx, lockKey(key)).Val(); !strings.HasSuffix(v, "+") || len(v) != len(holder)+32+1 {
		t.Errorf("value after a failed attempt = %q, want the holder, 32 hex digits and the mark", v)
	}
	if info, err := d.Inspect(ctx, key); err != nil || !info.Held || info.Holder != holder {
		t.Errorf("Inspect(marked lock) = %+v, %v; want held by %q", info, err, holder)
	}
	if _, err := l.Refresh(ctx, time.Minute); err != nil {
		t.Errorf("Refresh of a marked lock = %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, channel, "sentinel").Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, err := ps.ReceiveMessage(rctx); err != nil || m.Payload != "1" {
		t.Errorf("first message after the release = %v, %v; want the release's", m, err)
	}
}

// A value planted under the prefix by something else is reported held
// (it blocks every acquire), with a holder only if it has the form a grant
// writes: the holder, then 32 lower-case hex digits (issue 23).
func TestInspectPlantedHolder(t *testing.T) {
	t.Parallel()
	c := serverClient(t)
	d := newDriver(t, c, nil)
	ctx := t.Context()
	owner := strings.Repeat("0123456789abcdef", 2)
	for _, tc := range []struct{ value, holder string }{
		{"v", ""},
		{"v+", ""},
		{owner, ""},
		{owner + "+", ""},
		{"web-1" + owner, "web-1"},
		{"web-1" + owner + "+", "web-1"},
		{"web-1" + strings.ToUpper(owner), ""},
		{"web-1\x1b[2J" + owner, ""},
		{strings.Repeat("h", backend.MaxHolderLen+1) + owner, ""},
		{strings.Repeat("x", 1000), ""},
	} {
		key := uniqueKey(t)
		if err := c.Set(ctx, lockKey(key), tc.value, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Del(context.WithoutCancel(ctx), lockKey(key)) })
		if info, err := d.Inspect(ctx, key); err != nil || !info.Held || info.Holder != tc.holder {
			t.Errorf("Inspect(value %.40q…) = %+v, %v; want held, holder %q", tc.value, info, err, tc.holder)
		}
	}
}
