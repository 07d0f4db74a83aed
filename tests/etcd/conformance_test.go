package etcd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
)

// harness runs the conformance suite on an etcd cluster. Each Locker gets
// its own client, closed with it.
type harness struct {
	endpoints []string
	next      atomic.Int64
	admin     *clientv3.Client
}

// NewLocker gives each Locker's client one member, taking the members in
// turn: Lockers of a cluster talk to different members, and each client has
// exactly one connection, made before it is returned (a client given
// several endpoints connects to the others in the background, which the
// suite's goroutine-leak check could catch half-way).
func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	i := h.next.Add(1) - 1
	return openLocker(ctx, h.endpoints[i%int64(len(h.endpoints)):][:1], opts)
}

// Expire drops every entry of key's queue (the holders' — an exclusive
// holder, every permit of a semaphore, every reader — and the waiters'), as
// the server does when their TTLs run out: each key is deleted in a
// transaction on its create revision (whichever lease it is on now), not
// by revoking the lease read a moment before, which its Locker may have
// put back in its pool since and reused for a grant on another key (a
// revoke would drop that one too).
func (h *harness) Expire(ctx context.Context, key string) error {
	resp, err := h.admin.Get(ctx, dir(key), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		// A key released since the read (and perhaps made again) is
		// left alone.
		k := string(kv.Key)
		if _, err := h.admin.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(k)).Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Residue reports any key left in key's queue.
func (h *harness) Residue(ctx context.Context, key string) (bool, error) {
	resp, err := h.admin.Get(ctx, dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, err
	}
	return resp.Count > 0, nil
}

func (h *harness) Close() { _ = h.admin.Close() }

func TestConformance(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "single", 3: "cluster3"}[n], func(t *testing.T) {
			eps := servers.Etcd(t, n).Endpoints()
			conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
				admin, err := clientv3.New(clientv3.Config{Endpoints: eps[:1], DialTimeout: 5 * time.Second})
				if err != nil {
					return nil, err
				}
				// Connect now, not at the first call inside a case that
				// counts goroutines.
				if _, err := admin.MemberList(ctx); err != nil {
					_ = admin.Close()
					return nil, err
				}
				return &harness{endpoints: eps, admin: admin}, nil
			})
		})
	}
}
