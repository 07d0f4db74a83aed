package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/bg"
	"github.com/dlock-go/dlock/internal/redishub"
	"github.com/dlock-go/dlock/internal/redisscript"
)

// Defaults of [Options].
const (
	DefaultPrefix      = "dlock:"
	DefaultDriftFactor = 0.01
	DefaultNodeTimeout = 50 * time.Millisecond
)

// cleanupTimeout bounds the release on all nodes after a failed attempt.
const cleanupTimeout = 2 * time.Second

// Options configure the Redlock backend. The zero value (or nil) is valid.
type Options struct {
	// Prefix is put before every key. Default DefaultPrefix ("dlock:"),
	// the single-Redis backend's, whose key layout Redlock shares.
	Prefix string
	// DriftFactor is the share of the TTL allowed for clock drift between
	// the nodes and this process: a grant is valid for
	// TTL − elapsed − (TTL × DriftFactor + 2ms). Default 0.01.
	DriftFactor float64
	// NodeTimeout bounds each node's round trip in an attempt, so that a
	// node that is down costs little of the TTL. It is also capped at a
	// tenth of the TTL. Default 50ms.
	NodeTimeout time.Duration
	// Locker configures the Locker that [New] returns. Nil means defaults.
	Locker *dlock.Options
}

// Driver is the Redlock implementation of backend.Driver.
type Driver struct {
	nodes       []goredis.UniversalClient
	quorum      int
	prefix      string
	drift       float64
	nodeTimeout time.Duration
	ownsClients bool
	closeOnce   sync.Once
	bg          bg.Group        // node calls and token write-backs; Close waits for them
	hubs        []*redishub.Hub // release channels, one pub/sub connection per node (watch.go)
	watchBG     bg.Group        // the goroutines of Watch; Close waits for them, within a bound
}

var (
	_ backend.Driver  = (*Driver)(nil)
	_ backend.Waiter  = (*Driver)(nil)
	_ backend.Drifter = (*Driver)(nil)
)

// New checks opts and returns a Locker over the independent masters nodes
// (an odd number, at least 3), configured by opts.Locker. The clients stay
// the caller's: closing the Locker leaves them open. Errors wrap
// [backend.ErrInvalidConfig], except when ctx ends while New resolves the
// nodes' host names (the same-server check): that error wraps
// [backend.ErrUnavailable] and ctx.Err().
func New(ctx context.Context, nodes []goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	d, err := NewDriver(ctx, nodes, opts)
	if err != nil {
		return nil, err
	}
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return dlock.New(d, lo), nil
}

// NewDriver is [New] without the Locker. It loads the scripts on the nodes
// that answer; a node that is down now gets them when it is first used.
func NewDriver(ctx context.Context, nodes []goredis.UniversalClient, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.DriftFactor == 0 {
		o.DriftFactor = DefaultDriftFactor
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = DefaultNodeTimeout
	}
	bad := func(format string, args ...any) (*Driver, error) {
		return nil, fmt.Errorf("%w: redlock: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	switch {
	case len(nodes) < 3 || len(nodes)%2 == 0:
		return bad("%d nodes: want an odd number, at least 3", len(nodes))
	case o.DriftFactor < 0 || o.DriftFactor >= 0.5:
		return bad("DriftFactor %v: want 0 (default) up to 0.5", o.DriftFactor)
	case o.NodeTimeout < 0:
		return bad("negative NodeTimeout %v", o.NodeTimeout)
	}
	seen := map[goredis.UniversalClient]int{}
	var servers []server
	for i, c := range nodes {
		switch c := c.(type) {
		case nil:
			return bad("node %d is nil", i)
		case *goredis.Ring, *goredis.ClusterClient:
			return bad("node %d is a %T; Redlock needs independent single masters", i, c)
		case *goredis.Client:
			o := c.Options()
			if !o.ContextTimeoutEnabled {
				return bad("node %d: set ContextTimeoutEnabled on its client, so that the per-node timeout cuts a slow round trip", i)
			}
			if plainDialer(o) {
				servers = append(servers, parseServer(i, o.Network, o.Addr, o.DB))
			}
		}
		if j, dup := seen[c]; dup {
			return bad("nodes %d and %d are the same client", j, i)
		}
		seen[c] = i
	}
	// One server listed twice (under two addresses, or with two database
	// numbers) would count as two votes.
	if err := checkServers(ctx, servers); err != nil {
		return nil, err
	}
	d := &Driver{
		nodes:       slices.Clone(nodes),
		quorum:      len(nodes)/2 + 1,
		prefix:      o.Prefix,
		drift:       o.DriftFactor,
		nodeTimeout: o.NodeTimeout,
	}
	d.newHubs()
	d.fanout(ctx, d.nodeTimeout*4, func(ctx context.Context, c goredis.UniversalClient) reply {
		for _, s := range redisscript.All {
			if err := s.Load(ctx, c).Err(); err != nil {
				return reply{err: err}
			}
		}
		return reply{}
	})
	return d, nil
}

// reply is one node's answer in a fan-out.
type reply struct {
	n     int64
	clock int64 // acquire: the node's clock (µs) when it granted, 0 if unknown
	err   error
}

// fanout runs f on every node in parallel, each bounded by timeout, and
// returns their replies in node order once all have answered or the timeout
// has passed (a node that has not answered by then counts as failed, even
// if its client ignores context deadlines): an attempt costs the slowest
// round trip, not their sum.
func (d *Driver) fanout(ctx context.Context, timeout time.Duration, f func(context.Context, goredis.UniversalClient) reply) []reply {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type indexed struct {
		i int
		reply
	}
	ch := make(chan indexed, len(d.nodes))
	for i, c := range d.nodes {
		d.bg.Go(func() { // Close waits for calls still on their way
			ch <- indexed{i, f(ctx, c)}
		})
	}
	out := make([]reply, len(d.nodes))
	answered := make([]bool, len(d.nodes))
	for range d.nodes {
		select {
		case r := <-ch:
			out[r.i], answered[r.i] = r.reply, true
		case <-ctx.Done():
			for i := range out {
				if !answered[i] {
					out[i] = reply{err: fmt.Errorf("no answer before the attempt ended (per-node timeout %v): %w", timeout, ctx.Err())}
				}
			}
			return out
		}
	}
	return out
}

// DriftFactor reports the drift factor, so that the Locker's deadlines
// use it too (backend.Drifter).
func (d *Driver) DriftFactor() float64 { return d.drift }

// nodeTimeoutFor is the per-node timeout of an attempt with this TTL.
func (d *Driver) nodeTimeoutFor(ttl time.Duration) time.Duration {
	return max(min(d.nodeTimeout, ttl/10), time.Millisecond)
}

// driftFor is the clock drift allowed for ttl.
func (d *Driver) driftFor(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*d.drift) + 2*time.Millisecond
}

func (d *Driver) keys(key string) []string {
	lk := d.prefix + "{" + key + "}"
	return []string{lk, lk + redisscript.FenceSuffix}
}

// ValidateKey rejects keys that begin with "}" (see the redis backend).
func (d *Driver) ValidateKey(key string) error {
	if key[0] == '}' {
		return fmt.Errorf("%w: redlock: a key may not begin with \"}\"", backend.ErrInvalidKey)
	}
	return nil
}

// Limits: whole milliseconds; the TTL must leave room for the drift.
func (d *Driver) Limits() backend.Limits { return backend.Limits{MinTTL: 10 * time.Millisecond} }

// Guarantees: best-effort tokens, a minority of nodes may fail, and safety
// rests on timing.
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Fencing:           backend.FencingBestEffort,
		ToleratedFailures: (len(d.nodes) - 1) / 2,
		ClockDependent:    true,
		Notes: "Mutual exclusion rests on bounded clock drift, process pauses and network delays, and on " +
			"nodes that restart without the lock staying down for a TTL. " +
			"Each node issues the larger of its counter + 1 and its clock in microseconds, and the token is the " +
			"largest of the majority's. Release and Refresh raise every node's counter to the token in the script " +
			"that deletes or extends the lock; a granting node whose clock at the grant, plus the TTL less the " +
			"drift, does not pass the token has it written back right after the grant. A later holder's token can " +
			"equal or go below an earlier one only if no node of the later majority had recorded the earlier token " +
			"(the nodes the two majorities share lost their counter or restored a stale one in a restart, or the " +
			"lock key was deleted early on such a node (evicted, DEL, FLUSH), or the lease's key expired on that " +
			"node (unreleased there) and a write-back that was due failed or landed after it had expired) and the " +
			"clocks of the later majority all read behind it: stepped back by more than the time since the earlier grant (an " +
			"outage included), or behind the clock that issued it by more than the time between the two grants. " +
			"Use etcd or ZooKeeper where correctness matters.",
	}
}

// As supports *[]goredis.UniversalClient (the nodes).
func (d *Driver) As(target any) bool {
	if p, ok := target.(*[]goredis.UniversalClient); ok {
		*p = d.nodes
		return true
	}
	return false
}

// Close closes the pub/sub connections of Watch (waking the watchers that
// remain), waits for token write-backs in flight, and closes the clients if
// the driver built them from a URL. With a frozen node, the closing of its
// pub/sub connection is waited for at most 2s; it ends in the background.
func (d *Driver) Close() error {
	var errs []error
	d.closeOnce.Do(func() {
		d.closeWatches()
		d.bg.Close()
		d.bg.Wait()
		if d.ownsClients {
			for _, c := range d.nodes {
				errs = append(errs, c.Close())
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: redlock: closing the clients: %w", backend.ErrUnavailable, err)
	}
	return nil
}

func newValue() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TryAcquire is one round of the Redlock algorithm: SET NX PX (with a token
// from each node's counter, acquire.lua) on all nodes in parallel; the lock
// is ours with a majority and validity left (TTL − elapsed − drift > 0).
// The token is the largest of the majority's; Release raises the nodes'
// counters to it, and a granting node whose clock would not pass it before
// the lock can expire there gets it written back at once, in the
// background. Otherwise the lock is released on all nodes, those that
// seemed to fail included.
func (d *Driver) TryAcquire(ctx context.Context, key string, ttl time.Duration) (backend.Lease, error) {
	ms := ttl.Milliseconds()
	l := &lease{d: d, keys: d.keys(key), value: newValue(), ttl: time.Duration(ms) * time.Millisecond}
	start := time.Now()
	replies := d.fanout(ctx, d.nodeTimeoutFor(ttl), func(ctx context.Context, c goredis.UniversalClient) reply {
		// "clock": the grant's reply carries the node's clock too.
		return acquireReply(redisscript.Acquire.Run(ctx, c, l.keys, l.value, ms, "clock").Result())
	})
	elapsed := time.Since(start)
	var (
		granted, held, failed int
		token                 int64
		retryAfter            time.Duration
		lastErr               error
	)
	for _, r := range replies {
		switch {
		case r.err != nil:
			failed++
			lastErr = r.err
		case r.n > 0:
			granted++
			token = max(token, r.n)
		default:
			held++
			if pttl := time.Duration(max(-2-r.n, 0)) * time.Millisecond; pttl > retryAfter {
				retryAfter = pttl
			}
		}
	}
	validity := l.ttl - elapsed - d.driftFor(l.ttl)
	if granted < d.quorum && ctx.Err() != nil {
		// The caller gave up: that is no failure of the nodes.
		l.releaseAll(ctx)
		return nil, fmt.Errorf("%w: %w", backend.ErrNotAcquired, ctx.Err())
	}
	if granted >= d.quorum && validity > 0 {
		l.token = uint64(token)
		l.granted = granted
		// The nodes learn the token when the lease is released: the
		// release script raises their counters to it in the script that
		// deletes the lock, at no extra round trip. A lease that expires
		// unreleased needs no write-back to a node whose clock passes
		// the token before the lock key can expire there: a later grant
		// there issues at least that clock. (Refresh, which can move the
		// expiry earlier, raises the counters in its script.) The other granting nodes (a
		// clock behind the token by about the TTL or more, or a grant of
		// unknown clock) get the token written back now, in the
		// background: the next grant comes only after this lease ends;
		// by then it has landed (or failed: the documented best-effort
		// case).
		passes := (l.ttl - d.driftFor(l.ttl)).Microseconds()
		behind := map[goredis.UniversalClient]bool{}
		for i, r := range replies {
			if r.err == nil && r.n > 0 && r.n < token && token-r.clock >= passes {
				behind[d.nodes[i]] = true
			}
		}
		if len(behind) > 0 {
			t := strconv.FormatInt(token, 10)
			d.bg.Go(func() {
				d.fanout(context.WithoutCancel(ctx), cleanupTimeout, func(ctx context.Context, c goredis.UniversalClient) reply {
					if !behind[c] {
						return reply{}
					}
					n, err := redisscript.Raise.Run(ctx, c, l.keys[1:], t).Int64()
					return reply{n: n, err: err}
				})
			})
		}
		return l, nil
	}
	l.releaseAll(ctx)
	switch {
	case granted >= d.quorum:
		return nil, fmt.Errorf("%w: redlock: a majority granted, but after %v nothing was left of the %v TTL; lock released", backend.ErrUnavailable, elapsed.Round(time.Millisecond), l.ttl)
	case failed > len(d.nodes)-d.quorum:
		// Too few nodes answered to tell.
		return nil, fmt.Errorf("%w: redlock: %d of %d nodes did not answer (%d needed): %w", backend.ErrUnavailable, failed, len(d.nodes), d.quorum, lastErr)
	}
	return nil, &backend.HeldError{RetryAfter: retryAfter}
}

// acquireReply reads a node's reply to acquire.lua run with the clock
// argument: {token, clock} (decimal strings) for a grant, a negative
// integer when the lock is held.
func acquireReply(v any, err error) reply {
	if err != nil {
		return reply{err: err}
	}
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return reply{n: v}
		}
	case []any:
		if len(v) == 2 {
			t, _ := v[0].(string)
			c, _ := v[1].(string)
			n, err1 := strconv.ParseInt(t, 10, 64)
			clock, err2 := strconv.ParseInt(c, 10, 64)
			if err1 == nil && err2 == nil && n > 0 {
				return reply{n: n, clock: clock}
			}
		}
	}
	return reply{err: fmt.Errorf("redlock: unexpected reply from the acquire script: %v", v)}
}

// lease is a grant on a majority.
type lease struct {
	d       *Driver
	keys    []string // lock key, counter key
	value   string
	token   uint64
	ttl     time.Duration
	granted int
}

func (l *lease) Token() uint64      { return l.token }
func (l *lease) TTL() time.Duration { return l.ttl }

// Refresh extends the lock on all nodes (compare-and-PEXPIRE, never SET: a
// lapsed lock is not revived); it counts only with a majority, answered
// within the asked TTL less the drift. The same script raises each node's
// counter to the token: a shorter TTL moves the lock key's expiry earlier
// than the grant's, before the clock of a node whose write-back was
// skipped may have passed the token.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms := ttl.Milliseconds()
	start := time.Now()
	token := strconv.FormatUint(l.token, 10)
	replies := l.d.fanout(ctx, l.d.nodeTimeoutFor(ttl), func(ctx context.Context, c goredis.UniversalClient) reply {
		n, err := redisscript.Refresh.Run(ctx, c, l.keys, l.value, ms, token).Int64()
		return reply{n: n, err: err}
	})
	ok, notOurs, lastErr := count(replies)
	switch {
	case ok >= l.d.quorum && time.Since(start) < time.Duration(ms)*time.Millisecond-l.d.driftFor(ttl):
		l.ttl = time.Duration(ms) * time.Millisecond
		return l.ttl, nil
	case notOurs > len(l.d.nodes)-l.d.quorum:
		if ok > 0 {
			l.releaseAll(ctx) // the minority just extended must not block its nodes
		}
		return 0, fmt.Errorf("%w: redlock: the lock is no longer ours on %d of %d nodes", backend.ErrNotHeld, notOurs, len(l.d.nodes))
	}
	return 0, fmt.Errorf("%w: redlock: refresh confirmed on %d of %d nodes (%d needed): %v", backend.ErrUnavailable, ok, len(l.d.nodes), l.d.quorum, lastErr)
}

// Release deletes the lock on all nodes where it is still ours, raising
// each node's counter to the token in the same script (so that no later
// grant on a node can be issued before it knows this token). It succeeds
// only if the lock was ours on a majority; if a majority says it was not,
// the lease had been lost (ErrNotHeld) even where a minority still held it.
func (l *lease) Release(ctx context.Context) error {
	replies := l.releaseAll(ctx)
	ok, notOurs, lastErr := count(replies)
	switch {
	case ok >= l.d.quorum:
		return nil
	case notOurs > len(l.d.nodes)-l.d.quorum:
		return fmt.Errorf("%w: redlock: the lock was not ours on %d of %d nodes", backend.ErrNotHeld, notOurs, len(l.d.nodes))
	}
	return fmt.Errorf("%w: redlock: released on %d of %d nodes: %v", backend.ErrUnavailable, ok, len(l.d.nodes), lastErr)
}

// releaseAll runs the compare-and-delete on every node, bounded in time even
// if ctx has ended; with a token (a granted lease), the same script raises
// the node's counter to it.
func (l *lease) releaseAll(ctx context.Context) []reply {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	keys, args := l.keys[:1], []any{l.value}
	if l.token > 0 {
		keys, args = l.keys, []any{l.value, strconv.FormatUint(l.token, 10)}
	}
	return l.d.fanout(ctx, max(l.d.nodeTimeout, 100*time.Millisecond), func(ctx context.Context, c goredis.UniversalClient) reply {
		n, err := redisscript.Release.Run(ctx, c, keys, args...).Int64()
		return reply{n: n, err: err}
	})
}

// count tallies compare-and-X replies: 1 (done), 0 (not ours), errors.
func count(replies []reply) (ok, notOurs int, lastErr error) {
	for _, r := range replies {
		switch {
		case r.err != nil:
			lastErr = r.err
		case r.n == 1:
			ok++
		default:
			notOurs++
		}
	}
	return ok, notOurs, lastErr
}
