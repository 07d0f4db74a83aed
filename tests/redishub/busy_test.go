package redishub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/tests/servers"
)

// TestWatchBusySubscribe: a SUBSCRIBE that reaches the server while a
// script runs past the busy threshold is answered -BUSY, which go-redis
// drops; once the script has ended, the server allows the SUBSCRIBE, so a
// check finds nothing wrong, but the confirmation never comes. Watch must
// still return (an error: the waiter then polls), not wait for its
// context. (Before: it returned only when its 30s context ended.) When the
// machine is so slow that the SUBSCRIBE comes after the script, Watch is
// confirmed normally and the test proves nothing, but cannot fail.
func TestWatchBusySubscribe(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := client(t, addr)
	if err := admin.Do(t.Context(), "config", "set", "busy-reply-threshold", "100").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "config", "set", "busy-reply-threshold", "5000")
	prefix := unique(t) + ":"
	h := redishub.New(client(t, addr), prefix+"barrier:", "test")
	defer h.Close()
	// The Hub's pub/sub connection is made (and stays).
	_, stopA, err := h.Watch(t.Context(), prefix+"{a}:released")
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()

	// A script that spins for 250ms (busy from 100ms on; the check comes 250ms after the SUBSCRIBE), and a probe that sees it busy.
	busy, probe := client(t, addr), client(t, addr)
	scriptDone := make(chan struct{})
	go func() {
		defer close(scriptDone)
		busy.Eval(context.Background(), `local t0 = redis.call('TIME'); local s0 = t0[1]*1e6 + t0[2]
while true do local t = redis.call('TIME'); if t[1]*1e6 + t[2] - s0 > 250000 then break end end
return 1`, nil)
	}()
	defer func() { <-scriptDone }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := probe.Ping(t.Context()).Err()
		if err != nil && len(err.Error()) >= 4 && err.Error()[:4] == "BUSY" {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("the script was never seen busy (machine too slow?)")
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, stop, err := h.Watch(ctx, prefix+"{b}:released")
	took := time.Since(start)
	t.Logf("Watch returned after %v: %v", took.Round(time.Millisecond), err)
	switch {
	case err == nil:
		stop() // confirmed: the SUBSCRIBE came after the script
	case ctx.Err() != nil:
		t.Fatalf("Watch waited for its context (%v): %v", took, err)
	case !errors.Is(err, backend.ErrUnavailable):
		t.Fatalf("Watch: %v, want ErrUnavailable", err)
	}
}
