package zookeeper_test

import (
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zookeeper"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("zk://u:p@h2,h1:2181/locks/?session_timeout=5s&tick_time=200ms")
	srv, o, err := zookeeper.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if len(srv) != 2 || srv[0] != "h2:2181" || srv[1] != "h1:2181" || o.Prefix != "/locks" || o.Auth != "u:p" ||
		o.SessionTimeout != 5*time.Second || o.TickTime != 200*time.Millisecond {
		t.Errorf("parsed %v %+v", srv, o)
	}
	for _, bad := range []string{
		"zk:///locks", "zk://h1,,h2", "zk://h1?foo=1", "zk://h1?session_timeout=-1s",
		"zk://h1?session_timeout=x", "zk://user@h1", "zk://h1?tick_time=0s", "zk://h1?tick_time=-1s",
		"zk://h1?tick_time=x", "zk://h1?tick_time=1ms&tick_time=2ms",
	} {
		u, err := url.Parse(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := zookeeper.ParseURL(u); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestParseSecurityURL: the acl parameter and the zks scheme's TLS
// parameters.
func TestParseSecurityURL(t *testing.T) {
	hash := digest("bob:secret-b")
	u, err := url.Parse("zks://alice:secret-a@h1/locks?server_name=zk.example&acl=digest:alice:" +
		url.QueryEscape(digest("alice:secret-a")) + ":cdrwa,digest:bob:" + url.QueryEscape(hash) + ":rcd,world:anyone:r")
	if err != nil {
		t.Fatal(err)
	}
	_, o, err := zookeeper.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := append(zk.DigestACL(zk.PermAll, "alice", "secret-a"),
		zk.ACL{Perms: zk.PermRead | zk.PermCreate | zk.PermDelete, Scheme: "digest", ID: "bob:" + hash},
		zk.ACL{Perms: zk.PermRead, Scheme: "world", ID: "anyone"})
	if fmt.Sprint(o.ACL) != fmt.Sprint(want) {
		t.Errorf("acl: %v, want %v", o.ACL, want)
	}
	if o.TLS == nil || o.TLS.ServerName != "zk.example" {
		t.Errorf("zks: TLS %+v, want one verifying zk.example", o.TLS)
	}
	if _, o, err := zookeeper.ParseURL(mustURL(t, "zk://h1")); err != nil || o.TLS != nil || o.ACL != nil {
		t.Errorf("zk://h1: %+v %v, want no TLS and no ACL", o, err)
	}
	for _, bad := range []string{
		"zk://h1?acl=", "zk://h1?acl=world", "zk://h1?acl=world:anyone", "zk://h1?acl=world:anyone:x",
		"zk://h1?acl=world:anyone:rr", "zk://h1?acl=world:anyone:", "zk://h1?acl=:anyone:r",
		"zk://h1?acl=digest::r", "zk://h1?acl=auth::cdrwa", // auth needs credentials
		"zk://u:p@h1?acl=digest:bob:a+b=:cdrwa", // a '+' not escaped
		"zk://h1?ca=ca.pem", "zk://h1?server_name=x", "zks://h1?ca=/nonexistent.pem", "zks://h1?cert=c.pem",
	} {
		if _, _, err := zookeeper.ParseURL(mustURL(t, bad)); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

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
		if _, _, err := zookeeper.ParseURL(mustURL(t, "zk://alice:secret-a@h1?acl="+good)); err != nil {
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
		_, _, err := zookeeper.ParseURL(mustURL(t, "zk://alice:secret-a@h1?acl=auth::cdrwa,"+bad))
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

func mustURL(tb testing.TB, s string) *url.URL {
	tb.Helper()
	u, err := url.Parse(s)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// digest is ZooKeeper's digest of user:password (base64 of its SHA-1).
func digest(userPassword string) string {
	h := sha1.Sum([]byte(userPassword))
	return base64.StdEncoding.EncodeToString(h[:])
}
