package zookeeper_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/zookeeper"
)

// nastyKeys are keys the root API accepts but ZooKeeper paths cannot hold
// as they are.
var nastyKeys = []string{
	".", "..", "...", "/", "//", "a/b", "a/b/", "/a", "%", "%2F", "%25",
	" ", "a b", "\u0001", "\u001f", "\u007f", "\u0085", "\ud7ff", "\ue000",
	"\ufff0", "\uffff", "é", "日本", "\U0001F600", "zookeeper", "_c_x-lock-0000000001",
	strings.Repeat("k", 512), strings.Repeat("/", 512),
}

func TestEncodeKeyInjective(t *testing.T) {
	seen := map[string]string{}
	for _, k := range nastyKeys {
		enc := zookeeper.EncodeKey(k)
		if other, dup := seen[enc]; dup {
			t.Errorf("keys %q and %q both encode to %q", k, other, enc)
		}
		seen[enc] = k
		if enc == "." || enc == ".." || strings.Contains(enc, "/") {
			t.Errorf("key %q encodes to %q, not a valid path segment", k, enc)
		}
	}
}

// TestQueueOrderWraps: sequence numbers are a signed 32-bit counter that
// ZooKeeper formats with %010d; the order survives its wrap-around.
func TestQueueOrderWraps(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"_c_x-lock-0000000001", "_c_y-lock-0000000002", true},
		{"_c_x-lock-0000000002", "_c_y-lock-0000000001", false},
		{"_c_x-lock-2147483647", "_c_y-lock--2147483648", true}, // the wrap
		{"_c_x-lock--2147483648", "_c_y-lock--000000001", true},
		{"_c_x-lock--000000001", "_c_y-lock-0000000000", true},
	} {
		a, okA := zookeeper.Seq(tc.a)
		b, okB := zookeeper.Seq(tc.b)
		if !okA || !okB {
			t.Fatalf("Seq(%q) or Seq(%q) failed", tc.a, tc.b)
		}
		if got := zookeeper.Before(a, b); got != tc.want {
			t.Errorf("Before(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
