package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.BatchRefresher = (*Driver)(nil)

// maxRefreshMany is the most leases one refreshmany.lua call refreshes
// (the server runs nothing else while a script runs).
const maxRefreshMany = 1000

// RefreshBatch refreshes the leases of reqs in one round trip, each with
// the meaning of [backend.Lease.Refresh]: compare-and-PEXPIRE, the TTL
// truncated to whole milliseconds; a lease that is no longer ours gets an
// error wrapping [backend.ErrNotHeld] and changes nothing. A request whose
// TTL is below 1 ms gets an error wrapping [backend.ErrInvalidTTL] and is
// not sent. Like Refresh, it does not WAIT for replicas (see the package
// documentation, Replication).
//
// On a single primary (a *goredis.Client or a failover client), the
// refreshes go in one script call per 1,000 leases (refreshmany.lua; for
// shared leases, refreshmanyshared.lua), the calls in one pipeline; on a
// Cluster, one refresh.lua (refreshshared.lua) per lease (the keys of one
// script must share a slot), in one pipeline, which go-redis splits by
// shard and sends to the shards in parallel. If the server's script
// cache was flushed, the calls it refused are sent again with EVAL, in a
// second round trip.
//
// ctx bounds the call as it bounds any go-redis command (see the package
// documentation, Timeouts and retries); requests whose command failed get
// an error wrapping [backend.ErrUnavailable] (and ctx.Err() once ctx has
// ended).
func (d *Driver) RefreshBatch(ctx context.Context, reqs []backend.RefreshRequest) {
	type item struct {
		req *backend.RefreshRequest
		l   *lease
		ms  int64
	}
	items := make([]item, 0, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		r.Granted, r.Err = 0, nil
		l, ok := r.Lease.(*lease)
		if !ok || l.d != d {
			r.Err = fmt.Errorf("%w: redis: a lease of type %T not granted by this driver", backend.ErrNotHeld, r.Lease)
			continue
		}
		ms, err := ttlMillis(r.TTL)
		if err != nil {
			r.Err = err
			continue
		}
		items = append(items, item{req: r, l: l, ms: ms})
	}
	if len(items) == 0 {
		return
	}

	// One call per lease on a Cluster, else per maxRefreshMany leases of
	// one kind: exclusive leases in refreshmany.lua, shared ones in
	// refreshmanyshared.lua.
	type call struct {
		items  []item
		keys   []string
		args   []any
		script *goredis.Script
		many   bool
		cmd    *goredis.Cmd
	}
	var calls []call
	if _, cluster := d.client.(shardIterator); cluster {
		calls = make([]call, len(items))
		for k, it := range items {
			c := call{items: items[k : k+1], keys: it.l.keys[:1], args: []any{it.l.args[0], it.ms}, script: refreshScript}
			if it.l.shared != nil {
				c.keys, c.script = it.l.shared.keys[:3], refreshSharedScript
			}
			calls[k] = c
		}
	} else {
		// Exclusive leases first, then shared ones (a stable
		// partition: a batch of one kind is not reordered).
		if slices.ContainsFunc(items, func(it item) bool { return it.l.shared != nil }) {
			slices.SortStableFunc(items, func(a, b item) int {
				return cmp.Compare(b2i(a.l.shared != nil), b2i(b.l.shared != nil))
			})
		}
		// The TTL as a string, formatted once per distinct TTL (the
		// watchdog's batches usually share one).
		var lastMs int64
		var lastArg any
		for len(items) > 0 {
			shared := items[0].l.shared != nil
			n := 1
			for n < min(len(items), maxRefreshMany) && (items[n].l.shared != nil) == shared {
				n++
			}
			c := call{items: items[:n], args: make([]any, 0, 2*n), script: refreshManyScript, many: true}
			if shared {
				c.keys, c.script = make([]string, 0, 3*n), refreshManySharedScript
			} else {
				c.keys = make([]string, 0, n)
			}
			for _, it := range c.items {
				if lastArg == nil || it.ms != lastMs {
					lastMs, lastArg = it.ms, strconv.FormatInt(it.ms, 10)
				}
				if shared {
					c.keys = append(c.keys, it.l.shared.keys[:3]...)
				} else {
					c.keys = append(c.keys, it.l.keys[0])
				}
				c.args = append(c.args, it.l.args[0], lastArg)
			}
			calls = append(calls, c)
			items = items[n:]
		}
	}

	// send runs calls[k] for k in idx in one pipeline.
	send := func(idx []int, eval bool) {
		pipe := d.client.Pipeline()
		for _, k := range idx {
			c := &calls[k]
			if eval {
				c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
			} else {
				c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
			}
		}
		_, _ = pipe.Exec(ctx) // the errors are in the commands
	}
	idx := make([]int, len(calls))
	for k := range idx {
		idx[k] = k
	}
	send(idx, false)
	idx = idx[:0] // refused for want of the script (a flushed cache)
	for k := range calls {
		if goredis.HasErrorPrefix(calls[k].cmd.Err(), "NOSCRIPT") {
			idx = append(idx, k)
		}
	}
	if len(idx) > 0 {
		send(idx, true)
	}

	for _, c := range calls {
		var (
			res []int64
			err error
		)
		if c.many {
			res, err = c.cmd.Int64Slice()
			if err == nil && len(res) != len(c.items) {
				err = fmt.Errorf("redis: a batch refresh script returned %d results for %d leases", len(res), len(c.items))
			}
		} else {
			var n int64
			n, err = c.cmd.Int64()
			res = []int64{n}
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
				err = errors.Join(err, cerr)
			}
			err = unavailable(err)
		}
		for k, it := range c.items {
			switch {
			case err != nil:
				it.req.Err = err
			case res[k] != 1:
				it.req.Err = errNotHeld
			default:
				it.req.Granted = time.Duration(it.ms) * time.Millisecond
			}
		}
	}
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
