package redis_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock/tests/servers"
)

// startSentinel starts a primary, replica and Sentinel of the test's own,
// terminated when the test ends; it skips the test where they need host
// networking and do not have it. (A lock across a Sentinel failover is the
// fault matrix's FailoverBeforeReplication cell, tests/matrix.)
func startSentinel(t *testing.T) *servers.RedisSentinel {
	t.Helper()
	r, err := servers.StartRedisSentinel(t.Context())
	if errors.Is(err, servers.ErrNeedsHostNetwork) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Terminate(context.WithoutCancel(t.Context())) })
	return r
}
