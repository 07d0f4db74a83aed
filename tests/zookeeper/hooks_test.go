package zookeeper_test

import (
	"net/url"
	"time"

	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/zookeeper"
)

// The backend's internals these tests use, registered in
// zookeeper/testhooks.go.
var (
	// encodeKey is a key's znode name under the prefix.
	encodeKey = testhook.Get[func(string) string]("zookeeper.EncodeKey")
	// parseURL is the URL parser, with no base Options.
	parseURL = testhook.Get[func(*url.URL) ([]string, *zookeeper.Options, error)]("zookeeper.ParseURL")
	// seq and before are the queue order.
	seq    = testhook.Get[func(string) (int32, bool)]("zookeeper.Seq")
	before = testhook.Get[func(a, b int32) bool]("zookeeper.Before")
	// cutOffMargin is how much longer than its session timeout a waiter
	// without a connection waits.
	cutOffMargin = testhook.Get[time.Duration]("zookeeper.CutOffMargin")
)
