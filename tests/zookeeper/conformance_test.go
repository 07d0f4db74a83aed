package zookeeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/tests/servers"
	"github.com/dlock-go/dlock/zookeeper"
)

// harness runs the conformance suite on a ZooKeeper server or ensemble.
// Each Locker has its own session.
type harness struct {
	servers []string
	admin   *zk.Conn
}

func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	return openLocker(ctx, h.servers, &zookeeper.Options{Locker: opts})
}

// Expire deletes every lock node in key's queue, as the server does when
// their sessions end: every lease on the key (all of a semaphore's permits,
// all readers) and every waiter. The listing follows a sync: the admin
// session's server may be a follower that has not yet applied the
// creation of a node another session has been granted.
func (h *harness) Expire(ctx context.Context, key string) error {
	if _, err := h.admin.Sync(parent(key)); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	kids, _, err := h.admin.Children(parent(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range kids {
		if err := h.admin.Delete(parent(key)+"/"+k, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return nil
}

// Residue reports a lock node left in key's queue, of any kind (exclusive,
// a permit, a reader; holding or waiting), as of a sync (see Expire).
// Deletions by a cancelled waiter finish in the background: allow them a
// moment.
func (h *harness) Residue(ctx context.Context, key string) (bool, error) {
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := h.admin.Sync(parent(key)); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return false, err
		}
		kids, _, err := h.admin.Children(parent(key))
		if errors.Is(err, zk.ErrNoNode) {
			return false, nil
		}
		if err != nil || len(kids) == 0 || time.Now().After(deadline) {
			return len(kids) > 0, err
		}
	}
}

func (h *harness) Close() {} // the admin session is the test's

func TestConformance(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "standalone", 3: "ensemble3"}[n], func(t *testing.T) {
			srv := servers.ZooKeeper(t, n).Servers()
			admin := adminConn(t, srv)
			conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
				return &harness{servers: srv, admin: admin}, nil
			})
		})
	}
}
