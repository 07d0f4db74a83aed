package redishub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/tests/servers"
)

// aclUser creates an ACL user with rules on the test server (through the
// default user, which has no password there) and returns a client that
// authenticates as it; the user is deleted at the end of the test.
func aclUser(t *testing.T, addr string, admin *goredis.Client, rules ...string) (string, *goredis.Client) {
	t.Helper()
	name := strings.ReplaceAll(unique(t), ".", "_")
	args := []any{"acl", "setuser", name, "reset", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "acl", "deluser", name).Err() })
	c := goredis.NewClient(&goredis.Options{Addr: addr, Username: name, Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	return name, c
}

// TestWatchRefusedSubscribe: a user without the right to the channel gets
// an error from Watch, with the server's NOPERM, instead of a wait that
// only the context ends (go-redis drops the SUBSCRIBE's error reply; the
// Hub waited for a confirmation that never came: issue 21, finding 1).
// The context here ends only after 20s: Watch must return well before.
func TestWatchRefusedSubscribe(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := client(t, addr)
	prefix := unique(t) + ":"
	_, c := aclUser(t, addr, admin, "~"+prefix+"*", "+@all") // no channels: Redis 7's default
	h := redishub.New(c, prefix+"barrier:", "test")
	defer h.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, stop, err := h.Watch(ctx, prefix+"{k}:released")
	took := time.Since(start)
	if err == nil {
		stop()
		t.Fatal("Watch of a channel the user may not subscribe to returned nil")
	}
	if ctx.Err() != nil {
		t.Fatalf("Watch returned only when its context ended (%v): %v", took, err)
	}
	var re goredis.Error
	if !errors.Is(err, backend.ErrUnavailable) || !errors.As(err, &re) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Watch: %v; want an error matching ErrUnavailable with the server's NOPERM reply", err)
	}
	t.Logf("Watch failed after %v: %v", took, err)

	// CheckSubscribe says the same, and nil for a user with the right.
	if err := h.CheckSubscribe(t.Context(), prefix+"{k}:released"); !errors.As(err, &re) {
		t.Errorf("CheckSubscribe without the channel right: %v, want the server's refusal", err)
	}
	_, ok := aclUser(t, addr, admin, "~"+prefix+"*", "&"+prefix+"*", "+@all")
	h2 := redishub.New(ok, prefix+"barrier:", "test")
	defer h2.Close()
	if err := h2.CheckSubscribe(t.Context(), prefix+"{k}:released"); err != nil {
		t.Errorf("CheckSubscribe with the channel right: %v", err)
	}
	_, stop2, err := h2.Watch(t.Context(), prefix+"{k}:released")
	if err != nil {
		t.Fatalf("Watch with the channel right: %v", err)
	}
	stop2()
}

// TestWatchRefusedAfterRevoke: channel rights taken away while the Hub's
// connection has subscriptions (Redis then closes that connection, and
// go-redis's re-subscription is refused too): a new Watch fails with the
// refusal, not a wait until its context ends.
func TestWatchRefusedAfterRevoke(t *testing.T) {
	addr := servers.Redis(t, 1)[0].Addr()
	admin := client(t, addr)
	prefix := unique(t) + ":"
	user, c := aclUser(t, addr, admin, "~"+prefix+"*", "&"+prefix+"*", "+@all")
	h := redishub.New(c, prefix+"barrier:", "test")
	defer h.Close()
	_, stop, err := h.Watch(t.Context(), prefix+"{a}:released")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := admin.Do(t.Context(), "acl", "setuser", user, "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// Redis 7 also closes the connections of clients subscribed to
	// channels they lose: a Watch that writes on the Hub's connection
	// before the PubSub has noticed fails with that (broken pipe,
	// reset), and the next one, on a new connection, meets the refusal.
	for try := 1; ; try++ {
		_, stopB, err := h.Watch(ctx, prefix+"{b}:released")
		if err == nil {
			stopB()
			t.Fatal("Watch after the channel rights were revoked returned nil")
		}
		if ctx.Err() != nil {
			t.Fatalf("Watch after the channel rights were revoked: %v; want the server's NOPERM before the context ends", err)
		}
		if strings.Contains(err.Error(), "NOPERM") {
			return
		}
		t.Logf("Watch %d: %v", try, err)
		if try == 3 {
			t.Fatalf("Watch after the channel rights were revoked: %v; want the server's NOPERM", err)
		}
	}
}
