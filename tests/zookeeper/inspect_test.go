package zookeeper_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestInspect(t *testing.T) {
	srv := servers.ZooKeeper(t, 1).Servers()
	admin := adminConn(t, srv)
	conformance.RunInspect(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{servers: srv, admin: admin}, nil
	}, conformance.InspectCaps{Token: true, Waiters: true})
}
