package zookeeper_test

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// shared is an ACL that lets two identities, alice and bob, share locks:
// bob's entry is written as one would without knowing his password.
var shared = append(zk.DigestACL(zk.PermAll, "alice", "secret-a"),
	zk.ACL{Perms: zk.PermAll, Scheme: "digest", ID: "bob:" + digest("bob:secret-b")})

// digest is ZooKeeper's digest of user:password (base64 of its SHA-1).
func digest(userPassword string) string {
	h := sha1.Sum([]byte(userPassword))
	return base64.StdEncoding.EncodeToString(h[:])
}

// uniquePrefix returns a prefix znode of the test's own.
func uniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "/dlock-acl-" + hex.EncodeToString(b[:])
}

// authConn returns a client session authenticated as auth (user:password),
// closed when tb ends.
func authConn(tb testing.TB, srv []string, auth string) *zk.Conn {
	tb.Helper()
	c := adminConn(tb, srv)
	if err := c.AddAuth("digest", []byte(auth)); err != nil {
		tb.Fatal(err)
	}
	return c
}

// holderNode returns the path of the only lock node of key under prefix,
// read by a client authenticated as auth.
func holderNode(tb testing.TB, c *zk.Conn, prefix, key string) (dir, node string) {
	tb.Helper()
	dir = prefix + "/" + encodeKey(key)
	kids, _, err := c.Children(dir)
	if err != nil || len(kids) != 1 {
		tb.Fatalf("the queue of %s: %v %v, want one node", dir, kids, err)
	}
	return dir, dir + "/" + kids[0]
}

// TestAnonymousCannotFreeLock: with credentials, an unauthenticated client
// can neither delete the holder's lock node or its key directory, nor
// create under them, nor take the prefix over with SetACL; the holder's
// lease stays valid and the lock held (issue 21, finding 2).
func TestAnonymousCannotFreeLock(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	for _, tc := range []struct {
		name          string
		holder, other zookeeper.Options
	}{
		{name: "shared identity",
			holder: zookeeper.Options{Auth: "alice:secret-a"},
			other:  zookeeper.Options{Auth: "alice:secret-a"}},
		{name: "two identities",
			holder: zookeeper.Options{Auth: "alice:secret-a", ACL: shared},
			other:  zookeeper.Options{Auth: "bob:secret-b", ACL: shared}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := uniquePrefix()
			tc.holder.Prefix, tc.other.Prefix = prefix, prefix
			holder := newLocker(t, srv, &tc.holder)
			other := newLocker(t, srv, &tc.other)
			key := uniqueKey(t)
			lease, err := holder.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			dir, node := holderNode(t, authConn(t, srv, tc.holder.Auth), prefix, key)

			anon := adminConn(t, srv)
			for _, try := range []struct {
				what string
				err  error
			}{
				{"Delete the lock node", anon.Delete(node, -1)},
				{"Delete the key directory", anon.Delete(dir, -1)},
				{"Create under the key directory", func() error {
					_, err := anon.Create(dir+"/_c_0-lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
					return err
				}()},
				{"Create under the prefix", func() error {
					_, err := anon.Create(prefix+"/planted", nil, 0, zk.WorldACL(zk.PermAll))
					return err
				}()},
				{"SetACL on the prefix", func() error {
					_, err := anon.SetACL(prefix, zk.DigestACL(zk.PermAll, "mallory", "m"), -1)
					return err
				}()},
				{"SetACL on the key directory", func() error {
					_, err := anon.SetACL(dir, zk.DigestACL(zk.PermAll, "mallory", "m"), -1)
					return err
				}()},
			} {
				if !errors.Is(try.err, zk.ErrNoAuth) {
					t.Errorf("an anonymous client's %s: %v, want %v", try.what, try.err, zk.ErrNoAuth)
				}
			}

			select {
			case <-lease.Done():
				t.Fatalf("the holder's lease ended: %v", lease.Err())
			default:
			}
			if err := lease.Refresh(t.Context(), 20*time.Second); err != nil {
				t.Fatalf("the holder's refresh: %v", err)
			}
			if _, err := other.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("another locker's TryAcquire while the lease is held: %v, want ErrNotAcquired", err)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestACLSharedByIdentities: Lockers of two identities that share an ACL
// (Options.ACL) exclude each other and hand the lock over: a waiter of one
// identity is woken by the other's release, through the predecessor watch
// (which reads the other's lock node).
func TestACLSharedByIdentities(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	prefix := uniquePrefix() + "/nested" // the ancestor too is created with the ACL
	alice := newLocker(t, srv, &zookeeper.Options{Prefix: prefix, Auth: "alice:secret-a", ACL: shared})
	bob := newLocker(t, srv, &zookeeper.Options{Prefix: prefix, Auth: "bob:secret-b", ACL: shared})
	key := uniqueKey(t)
	c := authConn(t, srv, "alice:secret-a")
	for _, pair := range [][2]*dlock.Locker{{alice, bob}, {bob, alice}} {
		first, second := pair[0], pair[1]
		lease, err := first.Acquire(t.Context(), key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := second.TryAcquire(t.Context(), key, nil); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of the other identity while the lock is held: %v, want ErrNotAcquired", err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := second.Acquire(t.Context(), key, nil)
			if err == nil {
				err = l.Release(t.Context())
			}
			got <- err
		}()
		// The waiter must queue behind the holder: wait until its node is there.
		for {
			kids, _, err := c.Children(prefix + "/" + encodeKey(key))
			if err != nil {
				t.Fatal(err)
			}
			if len(kids) == 2 {
				break
			}
			select {
			case err := <-got:
				t.Fatalf("the waiter returned while the lock was held: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("the waiter of the other identity: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the waiter of the other identity was not granted the lock within 30s of the release")
		}
	}
}

// records is a slog.Handler that keeps the messages of the records at Warn
// and above, each followed by its attributes.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *records) WithGroup(string) slog.Handler                { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		msg += " " + a.String()
		return true
	})
	r.msgs = append(r.msgs, msg)
	return nil
}

// with returns the messages that contain s.
func (r *records) with(s string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var got []string
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			got = append(got, m)
		}
	}
	return got
}

// TestWorldWritablePrefixWarns: a Locker with credentials warns, once, at
// open when its prefix (made by someone else) lets every client create,
// delete or change its ACL; not when it made the prefix itself, nor
// without credentials on loopback (the development case).
func TestWorldWritablePrefixWarns(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	open := func(o zookeeper.Options) *records {
		rec := &records{}
		o.Locker = &dlock.Options{Logger: slog.New(rec)}
		newLocker(t, srv, &o)
		return rec
	}
	const warning = "the prefix is world-writable"

	prefix := uniquePrefix()
	if _, err := adminConn(t, srv).Create(prefix, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if got := open(zookeeper.Options{Prefix: prefix, Auth: "alice:secret-a"}).with(warning); len(got) != 1 {
		t.Errorf("credentials, a prefix open to all: warnings %q, want one", got)
	}
	if got := open(zookeeper.Options{Prefix: uniquePrefix(), Auth: "alice:secret-a"}).with(warning); len(got) != 0 {
		t.Errorf("credentials, a prefix of its own: warnings %q, want none", got)
	}
	if got := open(zookeeper.Options{Prefix: uniquePrefix(), Auth: "alice:secret-a", ACL: zk.WorldACL(zk.PermAll)}).with(warning); len(got) != 1 {
		t.Errorf("credentials, an ACL open to all: warnings %q, want one", got)
	}
	if got := open(zookeeper.Options{Prefix: prefix}).with(""); len(got) != 0 {
		t.Errorf("no credentials on loopback: warnings %q, want none", got)
	}
}

// TestBadACL: an ACL the server would refuse is refused before any I/O.
func TestBadACL(t *testing.T) {
	for _, o := range []zookeeper.Options{
		{ACL: []zk.ACL{{Perms: 0, Scheme: "world", ID: "anyone"}}},
		{ACL: []zk.ACL{{Perms: 0x20, Scheme: "world", ID: "anyone"}}},
		{ACL: []zk.ACL{{Perms: zk.PermAll, ID: "anyone"}}},
		{ACL: []zk.ACL{{Perms: zk.PermAll, Scheme: "digest"}}},
		{ACL: zk.AuthACL(zk.PermAll)}, // no credentials
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if _, err := zookeeper.NewDriver(ctx, []string{"127.0.0.1:1"}, &o); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", o.ACL, err)
		}
		cancel()
	}
}
