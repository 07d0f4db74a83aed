package zookeeper_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

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
