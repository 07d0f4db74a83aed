package zookeeper_test

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// TestACLEntriesChecked: acl= takes the schemes of ZooKeeper's own
// providers, each with an id of its form, and other providers' (sasl) with
// any id, and its errors name the entry's index and scheme,
// never its text (a password typed where the digest belongs must not be
// echoed) (issue 21 review, finding 4).
func TestACLEntriesChecked(t *testing.T) {
	alice := url.QueryEscape(digest("alice:secret-a"))
	for _, good := range []string{
		"world:anyone:cdrwa", "digest:alice:" + alice + ":cdrwa", "auth::cdrwa",
		"digest:alice:" + alice + ":cdrwa,ip:10.0.0.0/8:r", "ip:127.0.0.1:cdrwa", "ip:::1:cdrwa",
		"auth::cdrwa,sasl:zkadmin@EXAMPLE.COM:cdrwa", // another provider's scheme: the server's to check
	} {
		if _, _, err := parseURL(mustURL(t, "zk://alice:secret-a@h1?acl="+good)); err != nil {
			t.Errorf("acl=%s: %v", good, err)
		}
	}
	for _, bad := range []string{
		"nosuch::cdrwa",                          // no id
		":alice:cdrwa",                           // no scheme
		"world:foo:cdrwa",                        // world's id is anyone
		"ip:notanip:cdrwa",                       // not an address or CIDR
		"ip:10.0.0.0/99:cdrwa",                   // not a CIDR
		"digest:alice:secret-a:cdrwa",            // a password, not the digest
		"digest:" + alice + ":cdrwa",             // no user
		"digest:alice:c2VjcmV0LWE=:cdrwa",        // base64, but not 20 bytes
		"world:anyone:r,digest:alice:secret-a:r", // the third entry
		"digest:alice:secret-a:cdrwx",            // bad permissions
		"alice-secret-a",                         // no scheme:id:perms
	} {
		// After an entry that gives the Locker its rights, so that only
		// the bad entry can be refused.
		_, _, err := parseURL(mustURL(t, "zk://alice:secret-a@h1?acl=auth::cdrwa,"+bad))
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("acl=%s: %v, want ErrInvalidConfig", bad, err)
			continue
		}
		if strings.Contains(err.Error(), "secret-a") || strings.Contains(err.Error(), "notanip") ||
			strings.Contains(err.Error(), "foo") || !strings.Contains(err.Error(), "entry ") {
			t.Errorf("acl=%s: %v, want an error naming the entry's index, not its text", bad, err)
		}
	}
}

// TestWorldWritableWarningMasksDigests: the warning about a world-writable
// prefix lists its ACL without the digest ids (an unsalted SHA-1 of
// user:password).
func TestWorldWritableWarningMasksDigests(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	prefix := uniquePrefix()
	acl := append(zk.WorldACL(zk.PermAll), zk.DigestACL(zk.PermAll, "alice", "secret-a")...)
	if _, err := adminConn(t, srv).Create(prefix, nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	rec := &records{}
	newLocker(t, srv, &zookeeper.Options{Prefix: prefix, Auth: "alice:secret-a", Locker: &dlock.Options{Logger: slog.New(rec)}})
	got := rec.with("world-writable")
	if len(got) != 1 || strings.Contains(got[0], digest("alice:secret-a")) || !strings.Contains(got[0], "digest:alice:") {
		t.Errorf("warnings %q: want one naming alice's entry without its digest", got)
	}
}
