package etcd_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

func TestInspect(t *testing.T) {
	eps := servers.Etcd(t, 1).Endpoints()
	conformance.RunInspect(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		admin, err := clientv3.New(clientv3.Config{Endpoints: eps[:1], DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		return &harness{endpoints: eps, admin: admin}, nil
	}, conformance.InspectCaps{Token: true, TTL: true, Waiters: true})
}
