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
// Each Locker has its own session. admin deletes; reader, if not nil,
// reads (else admin does).
type harness struct {
	servers []string
	admin   *zk.Conn
	reader  *zk.Conn
}

// lister is the session that lists a queue.
func (h *harness) lister() *zk.Conn {
	if h.reader != nil {
		return h.reader
	}
	return h.admin
}

func (h *harness) NewLocker(ctx context.Context, opts *dlock.Options) (*dlock.Locker, error) {
	return openLocker(ctx, h.servers, &zookeeper.Options{Locker: opts})
}

// Expire deletes every lock node in key's queue, as the server does when
// their sessions end: every lease on the key (all of a semaphore's permits,
// all readers) and every waiter. The listing follows a sync, on a server
// that a sync orders: one whose sync passes through the leader and is
// answered once it has applied every creation the leader committed before
// it. A sync of the leader's own client is answered at once, and the
// leader may not have applied a creation that a follower has already
// answered. The deletes are best sent by the leader, which decides a
// session's end: a deletion by a client of a follower may reach a Locker
// on the leader just after its refresh's sync (zookeeper/doc.go: another
// client allowed to delete our node is outside the lock's guarantees). On
// an ensemble the conformance suite's harness thus lists on a follower and
// deletes on the leader.
func (h *harness) Expire(ctx context.Context, key string) error {
	r := h.lister()
	if _, err := r.Sync(parent(key)); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	kids, _, err := r.Children(parent(key))
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
		r := h.lister()
		if _, err := r.Sync(parent(key)); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return false, err
		}
		kids, _, err := r.Children(parent(key))
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
			e := servers.ZooKeeper(t, n)
			srv := e.Servers()
			var admin, reader *zk.Conn
			if n == 1 {
				admin = adminConn(t, srv)
			} else {
				// See Expire.
				lead := awaitLeader(t, e, nil)
				follower := (lead + 1) % n
				admin, reader = adminConn(t, srv[lead:lead+1]), adminConn(t, srv[follower:follower+1])
			}
			conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
				return &harness{servers: srv, admin: admin, reader: reader}, nil
			})
		})
	}
}
