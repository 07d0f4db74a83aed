package redlock_test

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
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// leastRights returns the ACL SETUSER line of the package documentation
// (Permissions) as arguments, for the user name: the tests use exactly
// the documented rights.
func leastRights(t *testing.T, name string) []string {
	t.Helper()
	doc, err := os.ReadFile("../../redlock/doc.go") // the package documentation, in the library
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

// aclNodes creates the ACL user (rules[i][0]) on node i of addrs with
// rules[i], through each server's default user, and returns clients that
// authenticate as it. The users are deleted at the end of the test.
func aclNodes(t *testing.T, addrs []string, rules [][]string) []goredis.UniversalClient {
	t.Helper()
	cs := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		admin := goredis.NewClient(&goredis.Options{Addr: a})
		t.Cleanup(func() { _ = admin.Close() })
		args := []any{"acl", "setuser"}
		for _, r := range rules[i] {
			args = append(args, r)
		}
		if err := admin.Do(t.Context(), args...).Err(); err != nil {
			t.Fatalf("node %d: ACL SETUSER: %v", i, err)
		}
		name := rules[i][0]
		t.Cleanup(func() { _ = admin.Do(context.Background(), "acl", "deluser", name).Err() })
		c := goredis.NewClient(&goredis.Options{Addr: a, Username: name, Password: "pw", ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}

// userName returns an ACL user name unique to the test.
func userName(t *testing.T) string {
	return "locker_" + strings.NewReplacer(".", "_", "/", "_").Replace(uniqueKey(t))
}

// aclNodeTimeout: the open-time check is waited for 4 × NodeTimeout (at
// least 2s); the tests give it 4s, for a loaded CI machine.
const aclNodeTimeout = time.Second

// TestACLRefusedOnOneNode: a user that lacks a right on one node of three
// is refused by NewDriver with ErrInvalidConfig naming that node, the
// right and the rule (issue 21, finding 1: the open succeeded, and waiters
// relied on the watch timeout).
func TestACLRefusedOnOneNode(t *testing.T) {
	t.Parallel()
	a := addrs(servers.Redis(t, 3))
	for _, tc := range []struct {
		node int
		drop string
		want string
	}{
		{1, "&dlock:*", "may not publish or subscribe to channel"},
		{2, "+evalsha", "may not run EVALSHA"},
		{0, "+subscribe", "may not run SUBSCRIBE"},
	} {
		t.Run("without "+tc.drop, func(t *testing.T) {
			t.Parallel()
			name := userName(t)
			rules := make([][]string, len(a))
			for i := range a {
				rules[i] = leastRights(t, name)
			}
			i := slices.Index(rules[tc.node], tc.drop)
			rules[tc.node] = slices.Delete(rules[tc.node], i, i+1)
			d, err := redlock.NewDriver(t.Context(), aclNodes(t, a, rules), &redlock.Options{NodeTimeout: aclNodeTimeout})
			if err == nil {
				_ = d.Close()
				t.Fatalf("NewDriver with a user without %s on node %d: nil error", tc.drop, tc.node)
			}
			if !errors.Is(err, backend.ErrInvalidConfig) {
				t.Errorf("NewDriver: %v; want an error wrapping ErrInvalidConfig", err)
			}
			for _, w := range []string{tc.want, tc.drop, `user "` + name + `" on node ` + string(rune('0'+tc.node)) + " (" + a[tc.node] + ")"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewDriver: %v; want it to say %q", err, w)
				}
			}
			for i := range a {
				if i != tc.node && strings.Contains(err.Error(), "on node "+string(rune('0'+i))) {
					t.Errorf("NewDriver: %v; names node %d, whose user has every right", err, i)
				}
			}
		})
	}
}

// TestACLLeastRights: a user with exactly the documented rights on every
// node opens, and a waiting Acquire (context.Background) is woken by the
// release, not by a poll (RetryMax, the fallback poll, is 30s here).
func TestACLLeastRights(t *testing.T) {
	t.Parallel()
	a := addrs(servers.Redis(t, 3))
	name := userName(t)
	cs := aclNodes(t, a, [][]string{leastRights(t, name), leastRights(t, name), leastRights(t, name)})
	opts := &redlock.Options{NodeTimeout: aclNodeTimeout, Locker: &dlock.Options{RetryMax: 30 * time.Second, TTL: time.Minute}}
	lk, err := redlock.New(t.Context(), cs, opts)
	if err != nil {
		t.Fatalf("New with the documented least rights: %v", err)
	}
	defer lk.Close()
	lk2, err := redlock.New(t.Context(), cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Close()
	key := uniqueKey(t)
	held, err := lk.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := lk2.Acquire(context.Background(), key, nil)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	// The waiter's watch in force on a majority: subscribed there.
	channel := lockKey(key) + ":released"
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := 0
		for _, addr := range a {
			admin := goredis.NewClient(&goredis.Options{Addr: addr})
			m, err := admin.PubSubNumSub(t.Context(), channel).Result()
			_ = admin.Close()
			if err == nil && m[channel] > 0 {
				n++
			}
		}
		if n == len(a) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the waiter subscribed to %s on %d of %d nodes within 20s", channel, n, len(a))
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

// TestACLChannelsRevoked: channel rights taken away on every node after
// New. A release whose PUBLISH is refused deletes the lock and reports
// success (it reported 'released on 0 of 3 nodes' with the scripts'
// errors, the lock gone all the same), and a waiter, its SUBSCRIBEs
// refused, acquires by polling.
func TestACLChannelsRevoked(t *testing.T) {
	t.Parallel()
	a := addrs(servers.Redis(t, 3))
	name := userName(t)
	cs := aclNodes(t, a, [][]string{leastRights(t, name), leastRights(t, name), leastRights(t, name)})
	opts := &redlock.Options{NodeTimeout: aclNodeTimeout, Locker: &dlock.Options{TTL: time.Minute}}
	lk, err := redlock.New(t.Context(), cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	lk2, err := redlock.New(t.Context(), cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Close()
	key := uniqueKey(t)
	held, err := lk.TryAcquire(t.Context(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	admins := make([]*goredis.Client, len(a))
	for i, addr := range a {
		admins[i] = goredis.NewClient(&goredis.Options{Addr: addr})
		defer admins[i].Close()
		if err := admins[i].Do(t.Context(), "acl", "setuser", name, "resetchannels").Err(); err != nil {
			t.Fatal(err)
		}
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
	// Wait until the waiter has marked the lock on every node (its
	// attempt found it held), so that the release publishes.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := 0
		for _, admin := range admins {
			if v, _ := admin.Get(t.Context(), lockKey(key)).Result(); strings.HasSuffix(v, "+") {
				n++
			}
		}
		if n == len(admins) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the waiter marked the lock on %d of %d nodes within 20s", n, len(admins))
		}
	}
	if err := held.Release(t.Context()); err != nil {
		t.Errorf("Release whose PUBLISH is refused: %v; want nil (the lock is deleted)", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter, its SUBSCRIBEs refused: %v; want the lock, by polling", err)
	}
	// Release returns once a majority has deleted; the other deletes
	// finish in the background, and Close waits for them.
	_ = lk2.Close()
	_ = lk.Close()
	for i, admin := range admins {
		if n, err := admin.Exists(t.Context(), lockKey(key)).Result(); err != nil || n != 0 {
			t.Errorf("node %d: EXISTS %s = %d, %v; want 0", i, lockKey(key), n, err)
		}
	}
}
