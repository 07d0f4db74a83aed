package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Ownership identifies one grant in etcd terms, for callers who fence their
// own etcd writes with the lock: [Ownership.Cmp] is true in a transaction
// exactly while this grant still holds the lock, as concurrency.Mutex's
// IsOwner is.
type Ownership struct {
	// Key is the etcd key of this grant (the lock's directory plus the
	// lease ID).
	Key string
	// CreateRevision is Key's create revision, which is also the fencing
	// token (Lease.Token).
	CreateRevision int64
	// Lease is the etcd lease Key is attached to.
	Lease clientv3.LeaseID
}

// Cmp returns the comparison "this grant still holds the lock", for the If
// of a clientv3 transaction:
//
//	own, _ := etcd.OwnerOf(lease)
//	resp, err := client.Txn(ctx).If(own.Cmp()).Then(clientv3.OpPut(k, v)).Commit()
//	// resp.Succeeded is false if the lock was lost before the write.
func (o Ownership) Cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(o.Key), "=", o.CreateRevision)
}

// OwnerOf returns the etcd ownership of a lease taken through this backend;
// ok is false for a lease of another backend.
func OwnerOf(le *dlock.Lease) (o Ownership, ok bool) {
	ok = le.As(&o)
	return o, ok
}

// lease is a held lock: our key, first in its queue.
type lease struct {
	w *waiter

	leaseMu sync.Mutex // guards w.id, w.ttl and unsettled, changed by Refresh to a new TTL
	// unsettled are the new leases of moves whose outcome settleMove could
	// not learn: our key may be on one of them. Release revokes them too.
	unsettled []*waiter

	releasing atomic.Bool // our own Release deletes the key: not a loss
	lost      chan struct{}
	lostErr   error // set before lost is closed
	stop      context.CancelFunc
}

// newLease starts the loss watcher of a granted waiter.
func (d *Driver) newLease(w *waiter) *lease {
	l := &lease{w: w, lost: make(chan struct{})}
	ctx, cancel := context.WithCancel(d.ctx)
	l.stop = cancel
	d.bg.Go(func() { l.watchLoss(ctx) })
	return l
}

func (l *lease) Token() uint64 { return uint64(l.w.rev) }

func (l *lease) TTL() time.Duration {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.w.ttl
}

// Anchor is when the request that set the lease's expiry was sent: the
// grant, or the waiter's last keepalive.
func (l *lease) Anchor() time.Time { return l.w.anchor }

func (l *lease) Lost() <-chan struct{} { return l.lost }

func (l *lease) LostErr() error { return l.lostErr }

// As supports *Ownership.
func (l *lease) As(target any) bool {
	if p, ok := target.(*Ownership); ok {
		l.leaseMu.Lock()
		defer l.leaseMu.Unlock()
		*p = Ownership{Key: l.w.myKey, CreateRevision: l.w.rev, Lease: l.w.id}
		return true
	}
	return false
}

// owned is the transaction condition "our key is still ours, on the lease
// we keep alive".
func (l *lease) owned() []clientv3.Cmp {
	l.leaseMu.Lock()
	id := l.w.id
	l.leaseMu.Unlock()
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(l.w.myKey), "=", l.w.rev),
		clientv3.Compare(clientv3.LeaseValue(l.w.myKey), "=", id),
	}
}

// Refresh renews the lease. etcd cannot change a lease's TTL: for the TTL
// the lease was granted with, Refresh sends one keepalive; for another TTL,
// it grants a new lease and moves our key onto it in a transaction that
// checks we still own the key (the key keeps its create revision, so the
// token does not change), then revokes the old lease. Either way it
// confirms the key is still ours.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	secs := ttlSeconds(ttl)
	l.leaseMu.Lock()
	same, id := secs == l.w.secs, l.w.id
	l.leaseMu.Unlock()
	d := l.w.d
	if same {
		resp, err := call(ctx, d, "renewing the lease", func(ctx context.Context) (*clientv3.LeaseKeepAliveResponse, error) {
			return d.client.KeepAliveOnce(ctx, id)
		})
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			return 0, fmt.Errorf("%w: etcd: the lease has expired", backend.ErrNotHeld)
		case err != nil:
			return 0, err
		}
		tr, err := d.txn(ctx, "checking the lock key", l.owned())
		if err != nil {
			return 0, err
		}
		if !tr.Succeeded {
			return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
		}
		return time.Duration(resp.TTL) * time.Second, nil
	}

	g, err := call(ctx, d, "granting a lease", func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return d.client.Grant(ctx, secs)
	})
	if err != nil {
		return 0, err
	}
	nw := &waiter{d: d, id: g.ID}
	tr, err := d.txn(ctx, "moving the lock key to a new lease", l.owned(), clientv3.OpPut(l.w.myKey, "", clientv3.WithLease(g.ID)))
	if d.afterMove != nil {
		err = d.afterMove(err)
	}
	if err != nil {
		// The move may have happened. Find out which lease the key is
		// on before revoking either (revoking the wrong one would
		// delete our own lock).
		l.settleMove(ctx, id, g.ID, time.Duration(g.TTL)*time.Second)
		return 0, err
	}
	if !tr.Succeeded {
		nw.revoke(ctx)
		return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
	}
	l.adopt(g.ID, secs, time.Duration(g.TTL)*time.Second)
	(&waiter{d: l.w.d, id: id}).revoke(ctx) // no key on it now: revoking deletes nothing
	return time.Duration(g.TTL) * time.Second, nil
}

// txn commits If(cmps).Then(then...) within the request timeout.
func (d *Driver) txn(ctx context.Context, doing string, cmps []clientv3.Cmp, then ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return call(ctx, d, doing, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).If(cmps...).Then(then...).Commit()
	})
}

// adopt makes the lease keep id (of secs asked, ttl granted) alive from now
// on.
func (l *lease) adopt(id clientv3.LeaseID, secs int64, ttl time.Duration) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	l.w.id, l.w.secs, l.w.ttl = id, secs, ttl
}

// settleMove resolves a move of our key from lease old to lease nw (granted
// with ttl) whose outcome is unknown: it reads the key and keeps whichever lease it is on,
// revoking the other. If it cannot tell, both leases are left to run out
// and nw is remembered as unsettled, for Release to revoke too; owned()
// then fails if the key is on nw, so no later Refresh reports a lease it
// does not keep alive.
func (l *lease) settleMove(ctx context.Context, old, nw clientv3.LeaseID, ttl time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	resp, err := l.w.d.client.Get(rctx, l.w.myKey)
	if err != nil {
		l.setUnsettled(nw, ttl)
		return
	}
	if len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == l.w.rev && clientv3.LeaseID(resp.Kvs[0].Lease) == nw {
		g, err := l.w.d.client.TimeToLive(rctx, nw)
		if err == nil && g.TTL > 0 {
			l.adopt(nw, g.GrantedTTL, time.Duration(g.GrantedTTL)*time.Second)
			(&waiter{d: l.w.d, id: old}).revoke(ctx)
			return
		}
		l.setUnsettled(nw, ttl)
		return
	}
	(&waiter{d: l.w.d, id: nw}).revoke(ctx)
}

// setUnsettled records nw (granted with ttl) as a lease our key may be on.
func (l *lease) setUnsettled(nw clientv3.LeaseID, ttl time.Duration) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	l.unsettled = append(l.unsettled, &waiter{d: l.w.d, id: nw, ttl: ttl})
}

// Release deletes our key if it is still ours (a transaction on its create
// revision alone: whichever lease the key is on, a key of that name with
// that create revision is ours), then revokes the lease, and an unsettled
// one (see settleMove) too. If the delete fails (ctx has ended already, as
// with `defer lease.Release(reqCtx)` after a cancelled request; or the
// cluster did not answer), revoking the leases, with a context of their
// own, deletes the key anyway: the lock is freed at once instead of staying
// held for the rest of the TTL. Release then still returns the delete's
// error.
func (l *lease) Release(ctx context.Context) error {
	l.releasing.Store(true)
	tr, err := l.w.d.txn(ctx, "deleting the lock key",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.w.myKey), "=", l.w.rev)},
		clientv3.OpDelete(l.w.myKey))
	l.stop()
	l.leaseMu.Lock()
	w := &waiter{d: l.w.d, id: l.w.id, ttl: l.w.ttl}
	unsettled := l.unsettled
	l.unsettled = nil
	l.leaseMu.Unlock()
	// The revokes ignore ctx's end; the only key on any of these leases
	// is ours. They run at once, so that a failed Release still takes
	// at most cleanupTimeout more.
	var wg sync.WaitGroup
	for _, un := range unsettled {
		wg.Go(func() { un.revoke(ctx) })
	}
	w.revoke(ctx)
	wg.Wait()
	if err != nil {
		return err
	}
	if !tr.Succeeded {
		return fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
	}
	return nil
}

// watchLoss watches our key from the revision after its creation and
// reports its deletion (lease expired or revoked, key deleted) as a loss,
// unless our own Release deleted it. If the watch breaks (compaction, a
// cancelled watch, a member that lost its leader: the watch requires one),
// it reads the key and watches again. Each watch is cancelled when it ends,
// so no watcher is left on the server once the loss is reported.
func (l *lease) watchLoss(ctx context.Context) {
	c := l.w.d.client
	rev := l.w.rev + 1
	for ctx.Err() == nil {
		gone := false
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range c.Watch(wctx, l.w.myKey, clientv3.WithRev(rev), clientv3.WithFilterPut()) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					gone = true
				}
			}
			if gone {
				break
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if !gone {
			// The watch broke: is the key still ours?
			resp, err := l.w.d.get(ctx, "reading the lock key", l.w.myKey)
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			gone = len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.w.rev
			rev = resp.Header.Revision + 1
		}
		if gone {
			if !l.releasing.Load() {
				l.lostErr = fmt.Errorf("%w: etcd: the lock key was deleted (lease expired or revoked)", backend.ErrLeaseLost)
				close(l.lost)
			}
			return
		}
	}
}
