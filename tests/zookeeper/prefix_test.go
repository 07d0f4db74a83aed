package zookeeper_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// TestIdlePrefixCannotBeDeleted: with credentials, an anonymous client can
// neither delete an idle prefix (its key directories, container nodes,
// are gone) nor any child of it, so it cannot re-create the prefix under
// an ACL of its own and fail every acquire (issue 21, review finding 1).
func TestIdlePrefixCannotBeDeleted(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	prefix := uniquePrefix() // one level: its parent, the root, is world-writable
	alice := newLocker(t, srv, &zookeeper.Options{Prefix: prefix, Auth: "alice:secret-a"})
	// The prefix is idle: no key directory under it.
	anon := adminConn(t, srv)
	if err := anon.Delete(prefix, -1); !errors.Is(err, zk.ErrNotEmpty) {
		t.Errorf("an anonymous client's Delete of the idle prefix: %v, want %v", err, zk.ErrNotEmpty)
	}
	kids, _, err := authConn(t, srv, "alice:secret-a").Children(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if err := anon.Delete(prefix+"/"+k, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("an anonymous client's Delete of %s: %v, want %v", k, err, zk.ErrNoAuth)
		}
	}
	lease, err := alice.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestDeletedPrefixComesBack: a prefix deleted while a Locker is open (here
// world-writable: no credentials) is created again by its next acquire.
func TestDeletedPrefixComesBack(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	prefix := uniquePrefix()
	l := newLocker(t, srv, &zookeeper.Options{Prefix: prefix})
	admin := adminConn(t, srv)
	kids, _, err := admin.Children(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if err := admin.Delete(prefix+"/"+k, -1); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Delete(prefix, -1); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(t.Context(), uniqueKey(t), nil)
	if err != nil {
		t.Fatalf("TryAcquire after the prefix was deleted: %v", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestOpenRefusesUnusablePrefix: a prefix this Locker may not create
// under (another identity's; or ACL that gives this Locker no rights) is
// refused at open with ErrInvalidConfig naming the prefix and the user,
// never the password, instead of an Open that succeeds and acquires that
// all fail.
func TestOpenRefusesUnusablePrefix(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	mallory := uniquePrefix()
	if _, err := authConn(t, srv, "mallory:secret-m").Create(mallory, nil, 0, zk.AuthACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	alices := uniquePrefix()
	newLocker(t, srv, &zookeeper.Options{Prefix: alices, Auth: "alice:secret-a"})
	for _, c := range []struct {
		name string
		o    zookeeper.Options
		user string // or what the error says instead
	}{
		{"another identity's prefix", zookeeper.Options{Prefix: mallory, Auth: "alice:secret-a"}, "alice"},
		{"anonymous, another identity's prefix", zookeeper.Options{Prefix: mallory}, "anonymous"},
		{"bob, alice's prefix", zookeeper.Options{Prefix: alices, Auth: "bob:secret-b"}, "bob"},
		{"an ACL for alice, no Auth", zookeeper.Options{Prefix: uniquePrefix(),
			ACL: zk.DigestACL(zk.PermAll, "alice", "secret-a")}, "anonymous"},
		{"bob, an ACL for alice", zookeeper.Options{Prefix: uniquePrefix(), Auth: "bob:secret-b",
			ACL: zk.DigestACL(zk.PermAll, "alice", "secret-a")}, "bob"},
		// A scheme this server has no provider for passes the check
		// before I/O (sasl is another provider's); the server refuses
		// it, and that is ErrInvalidConfig too.
		{"a scheme the server does not know", zookeeper.Options{Prefix: uniquePrefix(), Auth: "bob:secret-b",
			ACL: append(zk.AuthACL(zk.PermAll), zk.ACL{Perms: zk.PermRead, Scheme: "nosuch", ID: "x"})}, "refuses the ACL"},
	} {
		l, err := openLocker(t.Context(), srv, &c.o)
		if err == nil {
			_ = l.Close()
			t.Errorf("%s: opened, want ErrInvalidConfig", c.name)
			continue
		}
		// An ACL that gives this Locker nothing is refused before any
		// I/O, and names no prefix.
		named := c.o.ACL != nil || strings.Contains(err.Error(), c.o.Prefix)
		if !errors.Is(err, dlock.ErrInvalidConfig) || !named ||
			!strings.Contains(err.Error(), c.user) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: %v, want ErrInvalidConfig naming the prefix and %s, no password", c.name, err, c.user)
		}
	}
}
