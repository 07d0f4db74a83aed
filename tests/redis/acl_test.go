package redis_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// leastRights returns the ACL SETUSER line of the package documentation
// (Permissions) as arguments, for the user name: the tests use exactly
// the documented rights.
func leastRights(t *testing.T, name string) []string {
	t.Helper()
	doc, err := os.ReadFile("../../redis/doc.go") // the package documentation, in the library
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(doc)) {
		if _, rest, ok := strings.Cut(line, "//\tACL SETUSER locker "); ok {
			return append([]string{name}, strings.Fields(rest)...)
		}
	}
	t.Fatal(`doc.go has no line "ACL SETUSER locker ..." (Permissions)`)
	return nil
}

// aclUser creates the ACL user name with rules (ACL SETUSER name rules...)
// on the test server, through the default user, and returns a client that
// authenticates as it. The user is deleted at the end of the test.
func aclUser(t *testing.T, rules []string) (string, *goredis.Client) {
	t.Helper()
	admin := serverClient(t)
	name := rules[0]
	args := []any{"acl", "setuser"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := admin.Do(t.Context(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "acl", "deluser", name).Err() })
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t), Username: name, Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	return name, c
}

// userName returns an ACL user name unique to the test.
func userName(t *testing.T) string {
	return "locker_" + strings.NewReplacer(".", "_", "/", "_").Replace(uniqueKey(t))
}

// without returns rules less the rule drop (which must be there).
func without(t *testing.T, rules []string, drop string) []string {
	t.Helper()
	i := slices.Index(rules, drop)
	if i < 0 {
		t.Fatalf("%q is not in %q", drop, rules)
	}
	return slices.Delete(slices.Clone(rules), i, i+1)
}

// TestACLRefusedAtOpen: a user that lacks a right the backend needs is
// refused by NewDriver with an error wrapping ErrInvalidConfig that names
// the right and the rule that grants it (issue 21, finding 1: a user
// without channel rights opened, and its waiters hung).
func TestACLRefusedAtOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		drop string   // a rule of the documented line left out
		want []string // in the error
	}{
		{"&dlock:*", []string{`may not publish or subscribe to channel "dlock:{\x00probe:`, "&dlock:*"}},
		{"+evalsha", []string{"may not run EVALSHA", "+evalsha"}},
		{"+eval", []string{"may not run EVAL", "+eval"}},
		{"+publish", []string{"may not run PUBLISH", "+publish"}},
		{"+subscribe", []string{"may not run SUBSCRIBE", "+subscribe"}},
		{"+script|load", []string{"may not run SCRIPT|LOAD", "+script|load"}},
		{"+append", []string{"may not run APPEND", "+append"}},
		{"~dlock:*", []string{`may not read or write key "dlock:{\x00probe:`, "~dlock:*"}},
		// The shared-lease scripts' commands (issue 24).
		{"+zadd", []string{"may not run ZADD", "+zadd"}},
		{"+zrange", []string{"may not run ZRANGE", "+zrange"}},
		{"+hdel", []string{"may not run HDEL", "+hdel"}},
		{"+pexpireat", []string{"may not run PEXPIREAT", "+pexpireat"}},
		// Inspect's (issue 24).
		{"+getrange", []string{"may not run GETRANGE", "+getrange"}},
		{"+strlen", []string{"may not run STRLEN", "+strlen"}},
		{"+hgetall", []string{"may not run HGETALL", "+hgetall"}},
	} {
		t.Run("without "+tc.drop, func(t *testing.T) {
			t.Parallel()
			name := userName(t)
			_, c := aclUser(t, without(t, leastRights(t, name), tc.drop))
			d, err := redis.NewDriver(t.Context(), c, nil)
			if err == nil {
				_ = d.Close()
				t.Fatalf("NewDriver with a user without %s: nil error", tc.drop)
			}
			if !errors.Is(err, backend.ErrInvalidConfig) {
				t.Errorf("NewDriver: %v; want an error wrapping ErrInvalidConfig", err)
			}
			want := append(slices.Clone(tc.want), `user "`+name+`"`, "ACL SETUSER "+name+" ")
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewDriver: %v; want it to say %q", err, w)
				}
			}
		})
	}
	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		name := userName(t)
		_, c := aclUser(t, leastRights(t, name))
		d, err := redis.NewDriver(t.Context(), c, &redis.Options{WaitReplicas: 1})
		if err == nil {
			_ = d.Close()
			t.Fatal("NewDriver with WaitReplicas and a user without +wait: nil error")
		}
		if !errors.Is(err, backend.ErrInvalidConfig) || !strings.Contains(err.Error(), "+wait") {
			t.Errorf("NewDriver: %v; want ErrInvalidConfig naming +wait", err)
		}
	})
}

// TestACLLeastRights: a user with exactly the documented rights opens, and
// a waiting Acquire (context.Background) is woken by the release, not by a
// poll: RetryMax (the fallback poll) is 30s here.
func TestACLLeastRights(t *testing.T) {
	t.Parallel()
	_, c := aclUser(t, leastRights(t, userName(t)))
	opts := &redis.Options{Locker: &dlock.Options{RetryMax: 30 * time.Second, TTL: time.Minute}}
	lk, err := redis.New(t.Context(), c, opts)
	if err != nil {
		t.Fatalf("New with the documented least rights: %v", err)
	}
	defer lk.Close()
	key := uniqueKey(t)
	held, err := lk.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	lk2, err := redis.New(t.Context(), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Close()
	got := make(chan error, 1)
	go func() {
		l, err := lk2.Acquire(context.Background(), key, nil)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	waitMarked(t, key)
	// The waiter's watch in force: subscribed to the release channel.
	admin := serverClient(t)
	channel := lockKey(key) + ":released"
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		m, err := admin.PubSubNumSub(t.Context(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if m[channel] > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the waiter did not subscribe to %s within 20s", channel)
		}
	}
	released := time.Now()
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the waiter acquired %v after the release", time.Since(released))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release within 10s (its fallback poll is 30s)")
	}
}

// TestACLInspect: a user with exactly the documented rights can Inspect
// every kind of key: free, held by a writer, by readers, by a semaphore's
// permits, and reserved for a waiting writer (Election on Redis polls
// Inspect, dlock inspect calls it). Inspect used MULTI/EXEC, HGETALL and
// more that the documented line did not grant: NOPERM.
func TestACLInspect(t *testing.T) {
	t.Parallel()
	_, c := aclUser(t, leastRights(t, userName(t)))
	lk, err := redis.New(t.Context(), c, &redis.Options{Locker: &dlock.Options{TTL: time.Minute}})
	if err != nil {
		t.Fatalf("New with the documented least rights: %v", err)
	}
	defer lk.Close()
	ctx := t.Context()
	check := func(what, key string, held, shared bool, holders int) {
		t.Helper()
		info, err := lk.Inspect(ctx, key)
		if err != nil {
			t.Fatalf("Inspect of %s with the documented least rights: %v", what, err)
		}
		if info.Held != held || info.Shared != shared || len(info.Holders) != holders {
			t.Errorf("Inspect of %s: %+v; want held %v, shared %v, %d holders", what, info, held, shared, holders)
		}
	}
	check("a free key", uniqueKey(t), false, false, 0)

	w := uniqueKey(t)
	wl, err := lk.TryAcquire(ctx, w, &dlock.AcquireOptions{Holder: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	check("a writer's key", w, true, false, 1)
	if info, _ := lk.Inspect(ctx, w); info.Token != wl.Token() || info.Holder != "writer" {
		t.Errorf("Inspect of a writer's key: token %d, holder %q; want %d, %q", info.Token, info.Holder, wl.Token(), "writer")
	}

	r := uniqueKey(t)
	for range 2 {
		if _, err := lk.TryAcquire(ctx, r, &dlock.AcquireOptions{Shared: true}); err != nil {
			t.Fatal(err)
		}
	}
	check("two readers' key", r, true, true, 2)

	p := uniqueKey(t)
	for range 3 {
		if _, err := lk.TryAcquire(ctx, p, &dlock.AcquireOptions{Permits: 3}); err != nil {
			t.Fatal(err)
		}
	}
	check("a full semaphore", p, true, true, 3)

	// A reservation: a waiting writer's attempt, then the reader's release.
	d := newDriver(t, c, nil)
	q := uniqueKey(t)
	rl, err := d.TryAcquire(ctx, backend.Request{Key: q, TTL: time.Minute, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	var held *backend.HeldError
	if _, err := d.TryAcquire(ctx, backend.Request{Key: q, TTL: time.Minute, Wait: time.Minute}); !errors.As(err, &held) {
		t.Fatalf("a waiting writer's attempt: %v, want a HeldError", err)
	}
	if err := rl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("a key reserved for a writer", q, false, false, 0)
}

// waitMarked polls until a waiter has marked key's lock (its value ends
// with '+', acquire.lua): the waiter has made its attempt and watches.
func waitMarked(t *testing.T, key string) {
	t.Helper()
	admin := serverClient(t)
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		v, _ := admin.Get(t.Context(), lockKey(key)).Result()
		if strings.HasSuffix(v, "+") {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no waiter marked %s within 20s (value %q)", key, v)
		}
	}
}

// TestACLChannelsRevoked: channel rights taken away after New (ACL SETUSER
// resetchannels). A waiting Acquire must not hang: its SUBSCRIBE is
// refused, and it polls and acquires once the lock is released; that
// release, whose PUBLISH is refused, deletes the lock and reports success
// (it reported the script's error, the lock gone all the same).
func TestACLChannelsRevoked(t *testing.T) {
	t.Parallel()
	name, c := aclUser(t, leastRights(t, userName(t)))
	lk, err := redis.New(t.Context(), c, &redis.Options{Locker: &dlock.Options{TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	key := uniqueKey(t)
	held, err := lk.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's Locker is another (a Locker's own waiters are woken
	// by its releases without the server).
	lk2, err := redis.New(t.Context(), c, &redis.Options{Locker: &dlock.Options{TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Close()
	admin := serverClient(t)
	if err := admin.Do(t.Context(), "acl", "setuser", name, "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		l, err := lk2.Acquire(ctx, key, nil)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	waitMarked(t, key)
	if err := held.Release(t.Context()); err != nil {
		t.Errorf("Release whose PUBLISH is refused: %v; want nil (the lock is deleted)", err)
	}
	if n, err := admin.Exists(t.Context(), lockKey(key)).Result(); err != nil || n != 0 {
		t.Errorf("after Release: EXISTS %s = %d, %v; want 0", lockKey(key), n, err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter, its SUBSCRIBE refused: %v; want the lock, by polling", err)
	}
}
