package redis_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestInspect(t *testing.T) {
	addr := serverAddr(t)
	conformance.RunInspect(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{admin: goredis.NewClient(&goredis.Options{Addr: addr})}, nil
	}, conformance.InspectCaps{Token: true, TTL: true})
}

// TestInspectCluster inspects through ClusterClients: MULTI/EXEC over the
// lock key and its counter (one slot), SCAN on every master.
func TestInspectCluster(t *testing.T) {
	s, err := servers.StartRedisCluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(t.Context())) })
	addr := s.Addr()
	slots := func(context.Context) ([]goredis.ClusterSlot, error) {
		return []goredis.ClusterSlot{{Start: 0, End: 16383, Nodes: []goredis.ClusterNode{{Addr: addr}}}}, nil
	}
	newClient := func() goredis.UniversalClient {
		return goredis.NewClusterClient(&goredis.ClusterOptions{ClusterSlots: slots})
	}
	conformance.RunInspect(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{admin: goredis.NewClient(&goredis.Options{Addr: addr}), newClient: newClient}, nil
	}, conformance.InspectCaps{Token: true, TTL: true})
}
