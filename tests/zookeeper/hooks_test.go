package zookeeper_test

import (
	"time"

	"github.com/dlock-go/dlock/internal/testhook"
)

// The backend's internals these tests use, registered in
// zookeeper/testhooks.go.
var (
	// encodeKey is a key's znode name under the prefix.
	encodeKey = testhook.Get[func(string) string]("zookeeper.EncodeKey")
	// cutOffMargin is how much longer than its session timeout a waiter
	// without a connection waits.
	cutOffMargin = testhook.Get[time.Duration]("zookeeper.CutOffMargin")
)
