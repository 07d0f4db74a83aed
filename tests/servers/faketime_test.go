package servers_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/tests/servers"
)

// serverOffset returns how far s's wall clock (TIME) is ahead of this
// process's, to within the round trip, which it adds to the bound it
// returns.
func serverOffset(ctx context.Context, t *testing.T, c *redis.Client) (offset, uncertainty time.Duration) {
	t.Helper()
	before := time.Now()
	st, err := c.Time(ctx).Result()
	after := time.Now()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	mid := before.Add(after.Sub(before) / 2)
	return st.Sub(mid), after.Sub(before)/2 + time.Millisecond // TIME has µs; slack for rounding
}

// TestFaketime: ShiftClock moves the server's wall clock (TIME) at once,
// by the absolute offset given, and keys expire by the shifted clock; the
// server stays up, and the offset survives a restart.
func TestFaketime(t *testing.T) {
	ctx := t.Context()
	ss, err := servers.StartRedisFaketime(ctx, 1)
	if err != nil {
		t.Fatalf("StartRedisFaketime: %v", err)
	}
	s := ss[0]
	t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(ctx)) })
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()

	// The clock has to be the host's to within a few seconds (the same
	// kernel clock, read through libfaketime with offset zero).
	const slack = 2 * time.Second
	near := func(what string, want time.Duration) {
		t.Helper()
		off, unc := serverOffset(ctx, t, c)
		if d := off - want; d < -(slack+unc) || d > slack+unc {
			t.Fatalf("%s: server clock is %v ahead of ours; want %v (±%v)", what, off, want, slack+unc)
		}
	}
	near("at start", 0)

	for _, d := range []time.Duration{30 * time.Second, -10 * time.Second, 90 * time.Minute, 0} {
		if err := s.ShiftClock(ctx, d); err != nil {
			t.Fatalf("ShiftClock(%v): %v", d, err)
		}
		near("after ShiftClock("+d.String()+")", d) // no waiting: at once
	}

	// Keys expire by the shifted wall clock: a 20s key survives a 10s jump
	// and is gone after a 60s one.
	key := "dlock:faketime:" + t.Name()
	if err := c.Set(ctx, key, "v", 20*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.ShiftClock(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if pttl, err := c.PTTL(ctx, key).Result(); err != nil || pttl <= 0 || pttl > 10*time.Second+slack {
		t.Fatalf("PTTL of a 20s key after a 10s jump = %v, %v; want about 10s", pttl, err)
	}
	if err := s.ShiftClock(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS of a 20s key after a 60s jump = %d, %v; want 0 (expired)", n, err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the jumps: %v", err)
	}
	if info, err := c.Info(ctx, "server").Result(); err != nil || info == "" {
		t.Fatalf("INFO after the jumps: %v", err)
	}

	// The offset is the machine's: it survives a crash and restart.
	if err := s.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c2 := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c2.Close()
	c = c2
	near("after a restart", 60*time.Second)
}
