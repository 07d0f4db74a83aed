package redlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

var _ backend.Inspector = (*Driver)(nil)

// inspectTimeout bounds each node's reads in Inspect and Keys: a node that
// is down costs at most this.
func (d *Driver) inspectTimeout() time.Duration { return max(d.nodeTimeout, time.Second) }

// Inspect implements backend.Inspector. It reads the lock key, its PTTL and
// its fencing counter on every node at once (each in one MULTI/EXEC,
// within inspectTimeout), writing nothing, and at most a bounded prefix of
// each value (enough for any value a grant writes; a large value planted
// under the prefix is not read whole on any node). The key is held when a
// majority of the nodes hold it with the same value; TTL is then the least
// PTTL among them, and Holder the holder description that value carries
// before the ownership part (the same on every node of a grant; see the
// package documentation), "" for a value that no grant wrote (planted by
// something else). Token is 0 (unknown): a grant's token is the largest
// counter of the majority that answered first, and the nodes' counters
// afterwards do not tell which that was. Waiters is -1 (no queue on the
// servers). When too few nodes answer to tell, the error wraps
// ErrUnavailable.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	lk := d.keys(key)[0]
	snaps := make([]redisscript.Snapshot, len(d.nodes))
	errs := make([]error, len(d.nodes))
	d.eachNode(ctx, errs, func(ctx context.Context, i int) (err error) {
		snaps[i], err = redisscript.Inspect(ctx, d.nodes[i], lk)
		return err
	})
	failed := 0
	var firstErr error
	// A value is counted with whether it was cut at the bound: a value
	// planted under the prefix that begins with another node's whole
	// value is not the same value.
	type value struct {
		v       string
		foreign bool
	}
	count := map[value]int{}
	least := map[value]time.Duration{}
	holder := map[value]string{}
	for i, s := range snaps {
		if errs[i] != nil {
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", i, errs[i])
			}
			continue
		}
		if !s.Held {
			continue
		}
		v := value{s.Value, s.Foreign}
		count[v]++
		holder[v] = s.Holder // a function of the value
		if t, ok := least[v]; !ok || (s.PTTL > 0 && s.PTTL < t) || t == 0 {
			least[v] = s.PTTL
		}
	}
	best := 0
	var major value
	for v, n := range count {
		if n > best {
			best, major = n, v
		}
	}
	switch {
	case best >= d.quorum:
		return backend.LockInfo{Held: true, TTL: least[major], Holder: holder[major], Waiters: -1}, nil
	case best+failed >= d.quorum:
		return backend.LockInfo{}, fmt.Errorf("%w: redlock: %d of %d nodes did not answer, too many to tell whether the lock is held: %w",
			backend.ErrUnavailable, failed, len(d.nodes), firstErr)
	}
	return backend.LockInfo{Waiters: -1}, nil
}

// Keys implements backend.Inspector: the keys whose lock key exists on any
// node (a majority or not), by SCAN on each node. Every node must answer
// (within inspectTimeout) unless limit keys were found without it.
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	found := make([][]string, len(d.nodes))
	errs := make([]error, len(d.nodes))
	d.eachNode(ctx, errs, func(ctx context.Context, i int) (err error) {
		found[i], err = redisscript.LockKeys(ctx, d.nodes[i], d.prefix, limit)
		return err
	})
	seen := map[string]bool{}
	var keys []string
	for _, ks := range found {
		for _, k := range ks {
			if len(keys) < limit && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	if len(keys) < limit {
		for i, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("%w: redlock: listing the keys of node %d: %w", backend.ErrUnavailable, i, err)
			}
		}
	}
	return keys, nil
}

// eachNode calls f for every node at once, each with ctx bounded by
// inspectTimeout, and returns when all have returned. f returns its
// node's error, which is kept in errs[i] (a node cut by inspectTimeout
// while ctx lasts fails with a *nodeTimeoutError, not
// context.DeadlineExceeded: see ownTimeout).
func (d *Driver) eachNode(ctx context.Context, errs []error, f func(ctx context.Context, i int) error) {
	var wg sync.WaitGroup
	for i := range d.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, d.inspectTimeout())
			defer cancel()
			errs[i] = ownTimeout(ctx, f(nctx, i), "the inspect timeout "+d.inspectTimeout().String())
		})
	}
	wg.Wait()
}
