package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

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

	leaseMu sync.Mutex // guards w.id, w.secs, w.ttl, w.anchor and unsettled, changed by Refresh
	// unsettled are the new leases of moves whose outcome settleMove could
	// not learn: our key may be on one of them. Release revokes them too.
	unsettled []*waiter
}

// newLease makes a granted waiter a lease. Its loss is reported by the
// Driver's prefix watch (through w.reg): no goroutine of its own.
func (d *Driver) newLease(w *waiter) *lease { return &lease{w: w} }

func (l *lease) Token() uint64 { return uint64(l.w.rev) }

func (l *lease) TTL() time.Duration {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.w.ttl
}

// Anchor is when the request that set the lease's expiry was sent: the
// grant, the keepalive sent with the put of a pooled lease, or the waiter's
// last keepalive.
func (l *lease) Anchor() time.Time {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.w.anchor
}

// NotifyLoss implements backend.LossNotifier: f is called when the
// Driver's prefix watch sees our key deleted (its lease expired or was
// revoked, or someone deleted it), or when the watch, made again after a
// break, reads the key and finds it gone.
func (l *lease) NotifyLoss(f func(err error)) { l.w.reg.notify(f) }

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
// the lease was granted with, Refresh sends one keepalive (on one of the
// Driver's keepalive streams) and, at the same time, checks in a read-only
// transaction that the key is still ours on that lease; for another TTL,
// it grants a new lease and moves our key onto it in a transaction that
// checks we still own the key (the key keeps its create revision, so the
// token does not change), then revokes the old lease.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	secs := ttlSeconds(ttl)
	l.leaseMu.Lock()
	same, id := secs == l.w.secs, l.w.id
	l.leaseMu.Unlock()
	d := l.w.d
	if same {
		wait := d.ka.start(ctx, []clientv3.LeaseID{id})
		tr, terr := d.txn(ctx, "checking the lock key", l.owned())
		r := wait()[0]
		switch {
		case r.err != nil:
			return 0, r.err
		case terr != nil:
			return 0, terr
		case !tr.Succeeded:
			return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
		}
		l.renewed(id, r)
		return r.ttl, nil
	}
	return l.move(ctx, secs)
}

// renewed records a successful keepalive r of lease id.
func (l *lease) renewed(id clientv3.LeaseID, r renewal) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	if l.w.id == id {
		l.w.ttl, l.w.anchor = r.ttl, r.sent
	}
}

// move moves our key to a new lease of secs seconds (Refresh to another
// TTL).
func (l *lease) move(ctx context.Context, secs int64) (time.Duration, error) {
	d := l.w.d
	l.leaseMu.Lock()
	id := l.w.id
	l.leaseMu.Unlock()
	sent := time.Now()
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
		l.settleMove(ctx, id, g.ID, secs, time.Duration(g.TTL)*time.Second)
		return 0, err
	}
	if !tr.Succeeded {
		nw.revoke(ctx)
		return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
	}
	l.adopt(g.ID, secs, time.Duration(g.TTL)*time.Second, sent)
	(&waiter{d: l.w.d, id: id}).revoke(ctx) // no key on it now: revoking deletes nothing
	return time.Duration(g.TTL) * time.Second, nil
}

// txn commits If(cmps).Then(then...) within the request timeout.
func (d *Driver) txn(ctx context.Context, doing string, cmps []clientv3.Cmp, then ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return call(ctx, d, doing, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).If(cmps...).Then(then...).Commit()
	})
}

// adopt makes the lease keep id (of secs asked, ttl granted, its expiry set
// by a request sent at anchor) alive from now on.
func (l *lease) adopt(id clientv3.LeaseID, secs int64, ttl time.Duration, anchor time.Time) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	l.w.id, l.w.secs, l.w.ttl, l.w.anchor = id, secs, ttl, anchor
}

// settleMove resolves a move of our key from lease old to lease nw (of secs
// asked, granted with ttl) whose outcome is unknown: it reads the key and
// keeps whichever lease it is on, revoking the other. If it cannot tell,
// both leases are left to run out and nw is remembered as unsettled, for
// Release to revoke too; owned() then fails if the key is on nw, so no later
// Refresh reports a lease it does not keep alive.
func (l *lease) settleMove(ctx context.Context, old, nw clientv3.LeaseID, secs int64, ttl time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	resp, err := l.w.d.client.Get(rctx, l.w.myKey)
	if err != nil {
		l.setUnsettled(nw, ttl)
		return
	}
	if len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == l.w.rev && clientv3.LeaseID(resp.Kvs[0].Lease) == nw {
		sent := time.Now()
		g, err := l.w.d.client.TimeToLive(rctx, nw)
		if err == nil && g.TTL > 0 {
			// It lasts g.TTL from sent at least.
			granted := time.Duration(g.GrantedTTL) * time.Second
			l.adopt(nw, secs, granted, sent.Add(time.Duration(g.TTL)*time.Second-granted))
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
// that create revision is ours) and returns: that delete is its only Raft
// write. The lease, without a key now, goes back to the Driver's pool for a
// later grant of the same TTL. If the key was gone already (ErrNotHeld),
// the lease is revoked in the background. If the delete fails (ctx has
// ended already, as with `defer lease.Release(reqCtx)` after a cancelled
// request; or the cluster did not answer), revoking the leases, with a
// context of their own, deletes the key anyway: the lock is freed at once
// instead of staying held for the rest of the TTL. Release then still
// returns the delete's error. An unsettled lease (see settleMove) is
// revoked too.
func (l *lease) Release(ctx context.Context) error {
	d := l.w.d
	l.w.reg.stop() // our own delete is not a loss
	tr, err := d.txn(ctx, "deleting the lock key",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.w.myKey), "=", l.w.rev)},
		clientv3.OpDelete(l.w.myKey))
	l.leaseMu.Lock()
	w := &waiter{d: d, id: l.w.id, ttl: l.w.ttl}
	secs, anchor := l.w.secs, l.w.anchor
	unsettled := l.unsettled
	l.unsettled = nil
	l.leaseMu.Unlock()
	if err == nil && len(unsettled) == 0 {
		if !tr.Succeeded {
			d.revokeLater(w.id)
			return fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
		}
		d.recycle(secs, w.id, w.ttl, anchor.Add(w.ttl))
		return nil
	}
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

// RefreshBatch implements backend.BatchRefresher. The requests that keep
// their lease's TTL are renewed together: one keepalive each, all on one of
// the Driver's keepalive streams (no Raft write), each lease's new expiry
// counted from the moment its keepalive was sent. A lease whose keepalive
// finds it gone fails with ErrNotHeld, and so does one whose key the
// Driver's prefix watch has seen deleted; while that watch is not in force
// (it broke and is being made again), the keys are read instead, in
// transactions of up to 100 reads. A request for another TTL moves the key
// to a new lease, as Refresh does.
func (d *Driver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	var (
		idx []int
		ids []clientv3.LeaseID
		ls  []*lease
	)
	for i := range reqs {
		l, ok := reqs[i].Lease.(*lease)
		if !ok || l.w.d != d {
			reqs[i].Err = fmt.Errorf("%w: etcd: not a lease of this driver", backend.ErrNotHeld)
			continue
		}
		secs := ttlSeconds(reqs[i].TTL)
		l.leaseMu.Lock()
		same, id := secs == l.w.secs, l.w.id
		l.leaseMu.Unlock()
		if !same {
			continue // moved below
		}
		idx, ids, ls = append(idx, i), append(ids, id), append(ls, l)
	}
	if len(ids) > 0 {
		wait := d.ka.start(ctx, ids)
		var gone map[*lease]bool
		var gerr error
		if !d.hub.isLive() {
			gone, gerr = d.readOwned(ctx, ls)
		}
		rs := wait()
		for j, i := range idx {
			r, l := rs[j], ls[j]
			switch {
			case r.err != nil:
				reqs[i].Err = r.err
			case gerr != nil:
				reqs[i].Err = gerr
			case gone[l] || l.w.reg.isLost():
				reqs[i].Err = fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
			default:
				l.renewed(ids[j], r)
				reqs[i].Granted = r.ttl
			}
		}
	}
	for i := range reqs {
		if reqs[i].Err != nil || reqs[i].Granted != 0 {
			continue
		}
		l := reqs[i].Lease.(*lease)
		reqs[i].Granted, reqs[i].Err = l.move(ctx, ttlSeconds(reqs[i].TTL))
	}
}

// readOwned reads the keys of ls and returns those that are no longer
// ours.
func (d *Driver) readOwned(ctx context.Context, ls []*lease) (map[*lease]bool, error) {
	gone := map[*lease]bool{}
	for len(ls) > 0 {
		n := min(len(ls), recheckBatch)
		batch := ls[:n]
		ls = ls[n:]
		ops := make([]clientv3.Op, n)
		for i, l := range batch {
			ops[i] = clientv3.OpGet(l.w.myKey, clientv3.WithKeysOnly())
		}
		resp, err := d.txn(ctx, "checking the lock keys", nil, ops...)
		if err != nil {
			return nil, err
		}
		for i, l := range batch {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != l.w.rev {
				gone[l] = true
			}
		}
	}
	return gone, nil
}
