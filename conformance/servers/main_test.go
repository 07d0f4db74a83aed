package servers_test

import (
	"testing"

	"github.com/dlock-go/dlock/conformance/servers"
)

// The tests that need a client of a server (go-redis, etcd, ZooKeeper) are
// in the tests module (tests/servers), which may depend on them.
func TestMain(m *testing.M) { servers.Main(m) }
