package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lease pool: a released lock leaves its etcd lease without a key (the
// release deleted it), so the lease can carry the next grant of the same TTL
// instead of being revoked (a Raft write) and a new one granted (another).
// An acquire that takes a lease from the pool sends a keepalive at the same
// time as its put: the grant's expiry counts from that keepalive's sending,
// never from the pooled lease's past; unless the lease was renewed within
// the last tenth of the TTL the server granted it (a lock cycle just
// before): then the put goes alone, and the grant has what is left of the
// lease (its expiry counts from that renewal's sending). Pooled leases are
// not kept alive: one that may have run out is not handed out, and one that
// ran out all the same (revoked behind our back, say) fails the put with
// "lease not found", and the acquire grants a new lease.
const (
	// poolPerTTL is the most idle leases kept per TTL.
	poolPerTTL = 64
	// poolMinLeft is the least time a pooled lease must have left (by our
	// conservative count) to be handed out.
	poolMinLeft = time.Second
	// poolIdle is how long a lease may stay in the pool unused before it
	// is revoked (checked when the pool is used, and at Close).
	poolIdle = 30 * time.Second
	// poolFresh: a pooled lease with more than its granted TTL less a
	// poolFresh-th of it left (renewed that recently, by the lock it
	// carried before) is handed out without a keepalive; the grant's TTL
	// is then what is left of the lease. It is compared with the TTL the
	// server granted the lease, never with what a grant on it had left:
	// else each reuse would lower the bar, and the grants' TTLs would
	// decay.
	poolFresh = 10
)

// leaseState is where one etcd lease of ours is in its life:
//
//	inUse ⇄ idle      a grant holds it; a Release (or a waiter that leaves)
//	                  puts it in the pool, an acquire takes it out
//	inUse, idle → revoking → gone
//
// Revoking is final: once a revoke of a lease was started (and a failed
// one is retried in the background until the lease has run out), nothing
// makes it idle or in use again. A lease that anything may still revoke is
// thus never handed to another grant.
type leaseState int32

const (
	inUse    leaseState = iota // one owner (a waiter or a held lock): a key of ours is, or may be, on it
	idle                       // in the pool: no key on it
	revoking                   // a revoke was sent, and may be sent again
	gone                       // revoked, found gone, or left to run out
)

// etcdLease is one etcd lease of ours. Its id and granted TTL are set when
// it is made; its state changes only through to and revoke.
type etcdLease struct {
	id      clientv3.LeaseID
	granted time.Duration // the TTL the server granted it; a keepalive renews it to that
	state   atomic.Int32  // a leaseState
}

// newEtcdLease is a lease just granted (in use).
func newEtcdLease(id clientv3.LeaseID, granted time.Duration) *etcdLease {
	return &etcdLease{id: id, granted: granted}
}

// to moves e from state from to state next, and reports whether it was in
// from.
func (e *etcdLease) to(from, next leaseState) bool {
	return e.state.CompareAndSwap(int32(from), int32(next))
}

// startRevoke marks e as being revoked, whatever it was (a revoke of a lease
// that is gone already is harmless), for good.
func (e *etcdLease) startRevoke() {
	for {
		s := e.state.Load()
		if leaseState(s) == revoking || leaseState(s) == gone || e.state.CompareAndSwap(s, int32(revoking)) {
			return
		}
	}
}

// is reports whether e is in state s.
func (e *etcdLease) is(s leaseState) bool { return leaseState(e.state.Load()) == s }

// pooled is an idle lease: no key is on it.
type pooled struct {
	el      *etcdLease
	expires time.Time // it may have run out from then on: the last grant or keepalive's sending + el.granted
	idle    time.Time // when it was put in the pool
}

// pool holds idle leases by the TTL asked, in seconds.
type pool struct {
	mu     sync.Mutex
	closed bool
	free   map[int64][]pooled // last in, first out
}

// take returns an idle lease for secs with at least poolMinLeft left, if
// there is one, in use by the caller. Leases that may have run out are
// forgotten (they have no key; the server drops them).
func (p *pool) take(secs int64) (pooled, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.free[secs]
	for len(q) > 0 {
		e := q[len(q)-1]
		q = q[:len(q)-1]
		if time.Until(e.expires) >= poolMinLeft && e.el.to(idle, inUse) {
			p.free[secs] = q
			return e, true
		}
		e.el.to(idle, gone)
	}
	delete(p.free, secs)
	return pooled{}, false
}

// put makes e (in use) idle, in the pool. It returns the leases the caller
// is to revoke (marked as revoking): e itself if the pool is closed or
// full, and any that have been idle for poolIdle. A lease that is not in
// use (a revoke of it was started) is not put in the pool.
func (p *pool) put(secs int64, e pooled) (revoke []*etcdLease) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if e.el.is(inUse) {
			e.el.startRevoke()
			return []*etcdLease{e.el}
		}
		return nil
	}
	if !e.el.to(inUse, idle) {
		return nil
	}
	if p.free == nil {
		p.free = map[int64][]pooled{}
	}
	q := p.free[secs]
	now := time.Now()
	// The oldest are first: drop those idle too long, or run out.
	n := 0
	for n < len(q) && (now.Sub(q[n].idle) >= poolIdle || !now.Before(q[n].expires)) {
		if now.Before(q[n].expires) && q[n].el.to(idle, revoking) {
			revoke = append(revoke, q[n].el)
		} else {
			q[n].el.to(idle, gone)
		}
		n++
	}
	q = q[n:]
	if len(q) >= poolPerTTL {
		e.el.startRevoke()
		revoke = append(revoke, e.el)
	} else {
		e.idle = now
		q = append(q, e)
	}
	p.free[secs] = q
	return revoke
}

// close empties the pool and returns the leases that may still be alive
// (marked as revoking).
func (p *pool) close() []*etcdLease {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var els []*etcdLease
	now := time.Now()
	for _, q := range p.free {
		for _, e := range q {
			if now.Before(e.expires) && e.el.to(idle, revoking) {
				els = append(els, e.el)
			} else {
				e.el.to(idle, gone)
			}
		}
	}
	p.free = nil
	return els
}

// size is the number of idle leases (tests).
func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.free {
		n += len(q)
	}
	return n
}

// recycle puts el (in use, with no key on it now, expiring no earlier than
// expires) back in the pool, and revokes in the background what the pool
// gives back. A lease that a revoke was started for is not put back: it
// stays revoking (a second Release after a failed one lands here).
func (d *Driver) recycle(secs int64, el *etcdLease, expires time.Time) {
	for _, old := range d.pool.put(secs, pooled{el: el, expires: expires}) {
		d.revokeLater(old)
	}
}

// revokeLater revokes el in the background, once (a lease without a key
// that is not revoked runs out by itself); Close lets it finish, within
// cleanupTimeout.
func (d *Driver) revokeLater(el *etcdLease) {
	el.startRevoke()
	d.bg.Go(func() {
		ctx, cancel := context.WithTimeout(d.revokeCtx, cleanupTimeout)
		defer cancel()
		_ = d.revokeOnce(ctx, el)
		el.to(revoking, gone) // if it failed, it runs out by itself
	})
}

// revokeOnce sends one revoke of el, which is revoking. A lease the server
// no longer has counts as revoked.
func (d *Driver) revokeOnce(ctx context.Context, el *etcdLease) error {
	var err error
	if f := d.fault.Load(); f != nil {
		err = (*f)("revoking a lease", el.id)
	}
	if err == nil {
		_, err = d.client.Revoke(ctx, el.id)
	}
	if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		el.to(revoking, gone)
		return nil
	}
	return err
}

// revokePool revokes the idle leases, at Close, within cleanupTimeout.
func (d *Driver) revokePool() {
	els := d.pool.close()
	if len(els) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, el := range els {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = d.revokeOnce(ctx, el) // one that fails runs out by itself
		})
	}
	wg.Wait()
}
