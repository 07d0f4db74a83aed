package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
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
	ok = driver.LeaseAs(le, &o)
	return o, ok
}

// lease is a held lock: our key, first in its queue.
type lease struct {
	w *waiter

	leaseMu sync.Mutex // guards w.el, w.secs, w.ttl, w.anchor, w.modRev and unsettled, changed by Refresh
	// unsettled are the new leases of moves whose outcome settleMove could
	// not learn: our key may be on one of them (or on w.el). Nothing
	// revokes them, nor w.el, until a fencing transaction has settled
	// which lease the key is on (see settle), except Release, which
	// deletes the key first. Refresh and RefreshBatch settle them first.
	unsettled []pendingMove
}

// newLease makes a granted waiter a lease. Its loss is reported by the
// Driver's watch of its directory (through w.reg): no goroutine of its
// own.
func (d *Driver) newLease(w *waiter) *lease { return &lease{w: w} }

func (l *lease) Token() uint64 { return uint64(l.w.rev) }

// TTL is what the etcd lease lasts from Anchor at least: the TTL the
// server granted it.
func (l *lease) TTL() time.Duration {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.w.ttl
}

// Anchor is when the request that set the lease's expiry was sent: the
// grant (of the acquire, or of a move), the keepalive sent with the put of
// a pooled lease, the waiter's last keepalive, or the last keepalive of
// Refresh or RefreshBatch; for a pooled lease handed out without a
// keepalive, its last renewal's (or grant's) sending, which may be before
// the acquire began (at most a tenth of the TTL before it).
func (l *lease) Anchor() time.Time {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.w.anchor
}

// NotifyLoss implements backend.LossNotifier: f is called when the
// Driver's watch sees our key deleted (its lease expired or was revoked,
// or someone deleted it), or when the watch, made again after a break,
// reads the key and finds it gone.
func (l *lease) NotifyLoss(f func(err error)) { l.w.reg.notify(f) }

// As supports *Ownership (what OwnerOf returns, through driver.LeaseAs).
func (l *lease) As(target any) bool {
	if p, ok := target.(*Ownership); ok {
		l.leaseMu.Lock()
		defer l.leaseMu.Unlock()
		*p = Ownership{Key: l.w.myKey, CreateRevision: l.w.rev, Lease: l.w.el.id}
		return true
	}
	return false
}

// owned is the transaction condition "our key is still ours, on lease id,
// the one we keep alive".
func (l *lease) owned(id clientv3.LeaseID) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(l.w.myKey), "=", l.w.rev),
		clientv3.Compare(clientv3.LeaseValue(l.w.myKey), "=", id),
	}
}

// unchanged is owned(id) and "no write to our key since modRev, the mod
// revision of our last write to it whose outcome we know": the condition
// of every write of ours to the key after the join (a move, a fence). A
// write of ours whose answer was lost, which may still commit, has this
// condition with the modRev of its time; once any write to the key has
// committed after it, it never can.
func (l *lease) unchanged(id clientv3.LeaseID, modRev int64) []clientv3.Cmp {
	return append(l.owned(id), clientv3.Compare(clientv3.ModRevision(l.w.myKey), "=", modRev))
}

// Refresh renews the lease. etcd cannot change a lease's TTL: for the TTL
// the lease was granted with, Refresh sends one keepalive (on one of the
// Driver's keepalive streams) and, at the same time, checks in a
// linearizable read-only transaction that the key is still ours on that
// lease; for another TTL, it grants a new lease and moves our key onto it
// in a transaction that checks we still own the key (the key keeps its
// create revision, so the token does not change), then revokes the old
// lease. If an earlier move's outcome is still unknown (see settleMove),
// Refresh first settles it with a fencing transaction (see settle) and
// keeps the lease the key is on; if that fails too, Refresh fails
// (ErrUnavailable) and renews nothing.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	l.leaseMu.Lock()
	ms := l.unsettled
	l.unsettled = nil
	l.leaseMu.Unlock()
	if len(ms) > 0 {
		_, held, err := l.settle(ctx, ms)
		switch {
		case err != nil:
			return 0, err
		case !held:
			return 0, fmt.Errorf("%w: etcd: the lock key is gone, or on a lease we do not keep alive", backend.ErrNotHeld)
		}
	}
	secs := ttlSeconds(ttl)
	l.leaseMu.Lock()
	same, el := secs == l.w.secs, l.w.el
	l.leaseMu.Unlock()
	d := l.w.d
	if same {
		wait := d.ka.start(ctx, []clientv3.LeaseID{el.id})
		// The Then's read is what makes the check linearizable: etcd
		// answers a transaction with no operations, like any made only
		// of serializable reads, from the member's own state, which
		// may not yet hold a delete another member has answered.
		var (
			tr   *clientv3.TxnResponse
			terr error
			read sync.WaitGroup
		)
		read.Go(func() {
			tr, terr = resent(ctx, d, "checking the lock key", func(ctx context.Context) (*clientv3.TxnResponse, error) {
				return d.client.Txn(ctx).If(l.owned(el.id)...).
					Then(clientv3.OpGet(l.w.myKey, clientv3.WithCountOnly())).Commit()
			})
		})
		r := wait()[0] // the keepalive is awaited (and sent again) beside the read
		read.Wait()
		switch {
		case r.err != nil:
			return 0, r.err
		case terr != nil:
			return 0, terr
		case !tr.Succeeded:
			return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
		}
		l.renewed(el, r)
		return r.ttl, nil
	}
	return l.move(ctx, secs)
}

// renewed records a successful keepalive r of el: the lease lasts r.ttl
// (the TTL the server granted el) from r.sent.
func (l *lease) renewed(el *etcdLease, r renewal) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	if l.w.el == el {
		l.w.ttl, l.w.anchor = r.ttl, r.sent
	}
}

// pendingMove is the new lease of a move of our key whose outcome is not
// known: granted for secs asked, the grant sent at sent.
type pendingMove struct {
	el   *etcdLease
	secs int64
	sent time.Time
}

// move moves our key to a new lease of secs seconds (Refresh to another
// TTL). The move's transaction requires that the key is ours, on the lease
// we keep alive, unchanged since our last write to it (see unchanged): if
// its answer is lost, the fencing transaction of settle makes sure it can
// no longer commit, or learns that it did.
func (l *lease) move(ctx context.Context, secs int64) (time.Duration, error) {
	d := l.w.d
	l.leaseMu.Lock()
	old, modRev := l.w.el, l.w.modRev
	l.leaseMu.Unlock()
	sent := time.Now()
	g, err := call(ctx, d, "granting a lease", func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return d.client.Grant(ctx, secs)
	})
	if err != nil {
		return 0, err
	}
	nw := newEtcdLease(g.ID, time.Duration(g.TTL)*time.Second)
	cmps, put := l.unchanged(old.id, modRev), clientv3.OpPut(l.w.myKey, l.w.value, clientv3.WithLease(nw.id))
	if h := d.holdMove; h != nil {
		// Tests: the transaction is sent later, or never.
		err = h(nw.id, func(ctx context.Context) (bool, error) {
			r, err := d.client.Txn(ctx).If(cmps...).Then(put).Commit()
			return err == nil && r.Succeeded, err
		})
	}
	var tr *clientv3.TxnResponse
	if err == nil {
		tr, err = d.txn(ctx, "moving the lock key to a new lease", cmps, put)
		if d.afterMove != nil {
			err = d.afterMove(err)
		}
	}
	if err != nil {
		// The move may have happened, or may still happen. Settle
		// which lease the key is on before revoking either (revoking
		// the wrong one would delete our own lock).
		l.settleMove(ctx, pendingMove{el: nw, secs: secs, sent: sent})
		return 0, err
	}
	if !tr.Succeeded {
		d.revoke(ctx, nw)
		return 0, fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
	}
	l.adopt(nw, secs, nw.granted, sent, tr.Header.Revision)
	d.revoke(ctx, old) // no key on it now, and none can come back: revoking deletes nothing
	return nw.granted, nil
}

// txn commits If(cmps).Then(then...) within the request timeout.
func (d *Driver) txn(ctx context.Context, doing string, cmps []clientv3.Cmp, then ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return call(ctx, d, doing, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).If(cmps...).Then(then...).Commit()
	})
}

// adopt makes the lease keep el (of secs asked; it lasts ttl from anchor,
// the sending of the request that set its expiry) alive from now on; our
// key is on it, last written at modRev.
func (l *lease) adopt(el *etcdLease, secs int64, ttl time.Duration, anchor time.Time, modRev int64) {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	l.w.el, l.w.secs, l.w.ttl, l.w.anchor, l.w.modRev = el, secs, ttl, anchor, modRev
}

// settleMove resolves a move of our key to the lease of m whose outcome is
// unknown (see settle). If it cannot, neither lease is revoked and m is
// remembered as unsettled: the next Refresh (or RefreshBatch, which
// refreshes such a lease through Refresh) settles it first and renews
// nothing until it has, and Release deletes the key wherever it is and
// revokes both leases. No later refresh reports a lease it does not keep
// alive.
func (l *lease) settleMove(ctx context.Context, m pendingMove) {
	_, _, _ = l.settle(ctx, []pendingMove{m})
}

// settle learns which lease our key is on, among the one we keep alive
// (cur) and the new leases of the moves ms, whose outcome was unknown, and
// makes sure it stays there. A read could not do that: a move whose answer
// was lost may still be in the Raft log and commit after the read (and
// revoking the lease the read did not find the key on would then delete
// our key). So settle sends a fencing transaction:
//
//	If(the key is ours, on cur, unchanged since our last known write)
//	Then(put the key again on cur)   // a write: no earlier move can commit after it
//	Else(get the key)
//
// Every move compares the key's mod revision with that of our last known
// write, so once the fence (or any write) has committed, no move of ours
// whose answer was lost can commit any more. If the fence commits, the key
// stays on cur and the leases of ms are revoked. If not, the key's mod
// revision has changed (a move committed), or the key is gone: the key is
// where the Else's read found it, for good, and settle keeps that lease
// (adopting it if it is one of ms: it lasts its granted TTL from its
// grant's sending) and revokes the others. It returns the move adopted
// (nil if none), and whether the key is still ours on the lease we now keep
// alive. If the fence's outcome is unknown too, it returns its error and
// ms stay unsettled: nothing is revoked (the key may be on any of these
// leases).
func (l *lease) settle(ctx context.Context, ms []pendingMove) (*pendingMove, bool, error) {
	d := l.w.d
	l.leaseMu.Lock()
	cur, modRev := l.w.el, l.w.modRev
	l.leaseMu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	resp, err := call(rctx, d, "settling a move of the lock key", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).
			If(l.unchanged(cur.id, modRev)...).
			Then(clientv3.OpPut(l.w.myKey, l.w.value, clientv3.WithLease(cur.id))).
			Else(clientv3.OpGet(l.w.myKey)).
			Commit()
	})
	revokeMoves := func(keep *pendingMove) {
		for i := range ms {
			if &ms[i] != keep {
				d.revoke(ctx, ms[i].el) // no key of ours is, or can come, on it
			}
		}
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The fence's compares held (the key was on cur), yet cur is
		// gone: the key went with it, and no move can commit now.
		revokeMoves(nil)
		return nil, false, nil
	case err != nil:
		l.leaseMu.Lock()
		l.unsettled = append(l.unsettled, ms...)
		l.leaseMu.Unlock()
		return nil, false, err
	case resp.Succeeded:
		l.leaseMu.Lock()
		if l.w.el == cur {
			l.w.modRev = resp.Header.Revision
		}
		l.leaseMu.Unlock()
		revokeMoves(nil)
		return nil, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].CreateRevision != l.w.rev {
		revokeMoves(nil) // the key is gone: nothing of ours is on them
		return nil, false, nil
	}
	on, rev := clientv3.LeaseID(kvs[0].Lease), kvs[0].ModRevision
	if on == cur.id {
		l.leaseMu.Lock()
		if l.w.el == cur {
			l.w.modRev = rev
		}
		l.leaseMu.Unlock()
		revokeMoves(nil)
		return nil, true, nil
	}
	for i := range ms {
		if m := &ms[i]; m.el.id == on {
			l.adopt(m.el, m.secs, m.el.granted, m.sent, rev)
			revokeMoves(m)
			d.revoke(ctx, cur) // no key on it now, and none can come back
			return m, true, nil
		}
	}
	// On a lease that is not ours: someone else wrote our key.
	revokeMoves(nil)
	return nil, false, nil
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
// revoked too, after the delete (the key is ours on whichever lease it is,
// and a move still in flight compares the key's create revision, so it
// cannot bring the key back once it is deleted). A lease that a revoke was started for never goes back to
// the pool: a Release after a failed one deletes the key, if it is still
// there, and leaves the lease to that revoke.
func (l *lease) Release(ctx context.Context) error {
	d := l.w.d
	l.w.reg.stop() // our own delete is not a loss
	tr, err := d.txn(ctx, "deleting the lock key",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.w.myKey), "=", l.w.rev)},
		clientv3.OpDelete(l.w.myKey))
	l.leaseMu.Lock()
	el, secs, ttl, anchor := l.w.el, l.w.secs, l.w.ttl, l.w.anchor
	unsettled := l.unsettled
	l.unsettled = nil
	l.leaseMu.Unlock()
	if err == nil && len(unsettled) == 0 {
		if !tr.Succeeded {
			d.revokeLater(el)
			return fmt.Errorf("%w: etcd: the lock key is gone", backend.ErrNotHeld)
		}
		d.recycle(secs, el, anchor.Add(ttl)) // unless el is being revoked
		return nil
	}
	// The revokes ignore ctx's end; the only key on any of these leases
	// is ours. They run at once, so that a failed Release still takes
	// at most cleanupTimeout more.
	var wg sync.WaitGroup
	for _, m := range unsettled {
		wg.Go(func() { d.revoke(ctx, m.el) })
	}
	d.revoke(ctx, el)
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
// counted from the moment its keepalive was sent. Their keys are read at
// the same time, in linearizable transactions of up to 100 reads. A lease
// whose keepalive finds it gone fails with ErrNotHeld, and so does one
// whose key the read finds gone, made again or on another lease (or the
// Driver's watch has seen deleted); if a read fails, every lease of the
// batch fails with its error (ErrUnavailable). A request for another TTL, and one for
// a lease with a move of unknown outcome (whose key may be on another
// lease, which no delete would show), goes through Refresh on its own.
func (d *Driver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	var (
		idx []int
		els []*etcdLease
		ls  []*lease
	)
	alone := make([]bool, len(reqs))
	for i := range reqs {
		l, ok := reqs[i].Lease.(*lease)
		if !ok || l.w.d != d {
			reqs[i].Err = fmt.Errorf("%w: etcd: not a lease of this driver", backend.ErrNotHeld)
			continue
		}
		secs := ttlSeconds(reqs[i].TTL)
		l.leaseMu.Lock()
		same, el, unsettled := secs == l.w.secs, l.w.el, len(l.unsettled) > 0
		l.leaseMu.Unlock()
		if !same || unsettled {
			alone[i] = true
			continue
		}
		idx, els, ls = append(idx, i), append(els, el), append(ls, l)
	}
	if len(els) > 0 {
		ids := make([]clientv3.LeaseID, len(els))
		for j, el := range els {
			ids[j] = el.id
		}
		wait := d.ka.start(ctx, ids)
		// The keys are read as well, linearizably, while the keepalives
		// are awaited (and sent again if need be): the directory's watch
		// cannot stand in for the read, as it reports its member's own
		// state, which may lag the cluster's (and a frozen member's never
		// moves).
		var (
			gone map[*lease]bool
			gerr error
			read sync.WaitGroup
		)
		read.Go(func() { gone, gerr = d.readOwned(ctx, ls, els) })
		rs := wait()
		read.Wait()
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
				l.renewed(els[j], r)
				reqs[i].Granted = r.ttl
			}
		}
	}
	for i := range reqs {
		if alone[i] {
			reqs[i].Granted, reqs[i].Err = reqs[i].Lease.Refresh(ctx, reqs[i].TTL)
		}
	}
}

// readOwned reads the keys of ls, up to 100 to a transaction, the
// transactions at once (each sent again to another member if it goes
// unanswered: see resent), and returns those that are no longer ours on
// the lease of els with the same index: gone, made again, or put on
// another lease. The values are read too: etcd leaves the lease out of a
// keys-only read. One failed transaction fails the whole read.
func (d *Driver) readOwned(ctx context.Context, ls []*lease, els []*etcdLease) (map[*lease]bool, error) {
	n := (len(ls) + recheckBatch - 1) / recheckBatch
	resps := make([]*clientv3.TxnResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for c := range n {
		batch := ls[c*recheckBatch : min(len(ls), (c+1)*recheckBatch)]
		ops := make([]clientv3.Op, len(batch))
		for i, l := range batch {
			ops[i] = clientv3.OpGet(l.w.myKey)
		}
		wg.Go(func() {
			resps[c], errs[c] = resent(ctx, d, "checking the lock keys", func(ctx context.Context) (*clientv3.TxnResponse, error) {
				return d.client.Txn(ctx).Then(ops...).Commit()
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	gone := map[*lease]bool{}
	for j, l := range ls {
		kvs := resps[j/recheckBatch].Responses[j%recheckBatch].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != l.w.rev || clientv3.LeaseID(kvs[0].Lease) != els[j].id {
			gone[l] = true
		}
	}
	return gone, nil
}
