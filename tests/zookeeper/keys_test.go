package zookeeper_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/tests/servers"
)

// nastyKeys are keys the root API accepts but ZooKeeper paths cannot hold
// as they are.
var nastyKeys = []string{
	".", "..", "...", "/", "//", "a/b", "a/b/", "/a", "%", "%2F", "%25",
	" ", "a b", "\u0001", "\u001f", "\u007f", "\u0085", "\ud7ff", "\ue000",
	"\ufff0", "\uffff", "é", "日本", "\U0001F600", "zookeeper", "_c_x-lock-0000000001",
	strings.Repeat("k", 512), strings.Repeat("/", 512),
}

// TestNastyKeys: every nasty key can be locked, independently of the others.
func TestNastyKeys(t *testing.T) {
	t.Parallel()
	srv := servers.ZooKeeper(t, 1).Servers()
	l := newLocker(t, srv, nil)
	var leases []*dlock.Lease
	for _, k := range nastyKeys {
		le, err := l.TryAcquire(t.Context(), k, nil)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", k, err)
		}
		leases = append(leases, le)
	}
	for _, le := range leases {
		if err := le.Release(t.Context()); err != nil {
			t.Errorf("Release(%q): %v", le.Key(), err)
		}
	}
}
