package etcd

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lease pool: a released lock leaves its etcd lease without a key (the
// release deleted it), so the lease can carry the next grant of the same TTL
// instead of being revoked (a Raft write) and a new one granted (another).
// An acquire that takes a lease from the pool sends a keepalive at the same
// time as its put: the grant's expiry counts from that keepalive's sending,
// never from the pooled lease's past; unless the lease was renewed within
// the last tenth of its TTL (a lock cycle just before): then the put goes
// alone, and the grant has what is left of the lease (its expiry counts
// from that renewal's sending). Pooled leases are not kept alive: one
// that may have run out is not handed out, and one that ran out all the same
// (revoked behind our back, say) fails the put with "lease not found", and
// the acquire grants a new lease.
const (
	// poolPerTTL is the most idle leases kept per TTL.
	poolPerTTL = 64
	// poolMinLeft is the least time a pooled lease must have left (by our
	// conservative count) to be handed out.
	poolMinLeft = time.Second
	// poolIdle is how long a lease may stay in the pool unused before it
	// is revoked (checked when the pool is used, and at Close).
	poolIdle = 30 * time.Second
	// poolFresh: a pooled lease with more than its TTL less a poolFresh-th
	// of it left (renewed that recently, by the lock it carried before)
	// is handed out without a keepalive; the grant's TTL is then what is
	// left of the lease.
	poolFresh = 10
)

// pooled is an idle lease: no key is on it.
type pooled struct {
	id      clientv3.LeaseID
	ttl     time.Duration // granted
	expires time.Time     // it may have run out from then on: the last grant or keepalive's sending + ttl
	idle    time.Time     // when it was put in the pool
}

// pool holds idle leases by the TTL asked, in seconds.
type pool struct {
	mu     sync.Mutex
	closed bool
	free   map[int64][]pooled // last in, first out
}

// take returns an idle lease for secs with at least poolMinLeft left, if
// there is one. Leases that may have run out are forgotten (they have no
// key; the server drops them).
func (p *pool) take(secs int64) (pooled, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.free[secs]
	for len(q) > 0 {
		e := q[len(q)-1]
		q = q[:len(q)-1]
		if time.Until(e.expires) >= poolMinLeft {
			p.free[secs] = q
			return e, true
		}
	}
	delete(p.free, secs)
	return pooled{}, false
}

// put returns an idle lease to the pool. It returns the leases the caller
// is to revoke: e itself if the pool is closed or full, and any that have
// been idle for poolIdle.
func (p *pool) put(secs int64, e pooled) (revoke []clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return []clientv3.LeaseID{e.id}
	}
	if p.free == nil {
		p.free = map[int64][]pooled{}
	}
	q := p.free[secs]
	now := time.Now()
	// The oldest are first: drop those idle too long, or run out.
	n := 0
	for n < len(q) && (now.Sub(q[n].idle) >= poolIdle || !now.Before(q[n].expires)) {
		if now.Before(q[n].expires) {
			revoke = append(revoke, q[n].id)
		}
		n++
	}
	q = q[n:]
	if len(q) >= poolPerTTL {
		revoke = append(revoke, e.id)
	} else {
		e.idle = now
		q = append(q, e)
	}
	p.free[secs] = q
	return revoke
}

// close empties the pool and returns the leases that may still be alive.
func (p *pool) close() []clientv3.LeaseID {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var ids []clientv3.LeaseID
	now := time.Now()
	for _, q := range p.free {
		for _, e := range q {
			if now.Before(e.expires) {
				ids = append(ids, e.id)
			}
		}
	}
	p.free = nil
	return ids
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

// recycle puts the lease id (granted ttl, expiring no earlier than expires)
// back in the pool, and revokes in the background what the pool gives
// back.
func (d *Driver) recycle(secs int64, id clientv3.LeaseID, ttl time.Duration, expires time.Time) {
	for _, old := range d.pool.put(secs, pooled{id: id, ttl: ttl, expires: expires}) {
		d.revokeLater(old)
	}
}

// revokeLater revokes lease id in the background, once (a lease without a
// key that is not revoked runs out by itself).
func (d *Driver) revokeLater(id clientv3.LeaseID) {
	d.bg.Go(func() {
		ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
		defer cancel()
		_, _ = d.client.Revoke(ctx, id)
	})
}

// revokePool revokes the idle leases, at Close, within cleanupTimeout.
func (d *Driver) revokePool() {
	ids := d.pool.close()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, _ = d.client.Revoke(ctx, id) // one that fails runs out by itself
		})
	}
	wg.Wait()
}
