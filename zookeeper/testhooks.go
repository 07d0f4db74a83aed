package zookeeper

import "github.com/dlock-go/dlock/internal/testhook"

// The hooks below exist for the backend's tests against real servers in
// tests/zookeeper (the development module), which cannot reach this
// package's internals through an export_test.go. They do nothing unless a
// test calls them.
func init() {
	// The key encoding (a key's znode name under the prefix).
	testhook.Set("zookeeper.EncodeKey", encodeKey)
	// How much longer than its session timeout a waiter without a
	// connection waits.
	testhook.Set("zookeeper.CutOffMargin", cutOffMargin)
}
