package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bg"
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
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
	// the single-Redis backend's, whose key layout Redlock shares; it
	// must not contain '{' or '}' (the lock key is prefix + "{" + key +
	// "}").
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
	// Its Logger also receives the backend's warnings (a node that could
	// not be given the scripts or checked at start, a release that could
	// not be published; default slog.Default()): the one field NewDriver
	// reads.
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
	log         *slog.Logger
	closeOnce   sync.Once
	bg          bg.Group        // script loading in NewDriver; Close waits for it
	disp        []*dispatcher   // one queue per node, sent in pipelines (dispatch.go)
	calls       sync.WaitGroup  // calls queued or in flight, until their replies are handled (round.go)
	hubs        []*redishub.Hub // release channels, one pub/sub connection per node (watch.go)
	watchBG     bg.Group        // the goroutines of Watch; Close waits for them, within a bound

	// unannounced is when a release that could not be published was
	// last logged (UnixNano; 0: never), see warnUnannounced.
	unannounced atomic.Int64

	// afterGrant, if set (tests only: the hook redlock.AfterGrant of
	// testhooks.go), is called by TryAcquire once a majority has granted,
	// before the grant's validity is computed: a test pauses there, as a
	// GC or a stopped process would, so that the grant is judged after
	// its validity.
	afterGrant func()
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.Waiter         = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
)

// New checks opts and returns a Locker over the independent masters nodes
// (an odd number, at least 3), configured by opts.Locker (whose Logger the
// backend logs to as well). The clients stay the caller's: closing the
// Locker leaves them open. Errors wrap [backend.ErrInvalidConfig] (bad
// options, opts.Locker included, before any I/O; a node whose user lacks a
// right the backend needs, see [NewDriver]), except when ctx ends
// while New resolves the nodes' host names (the same-server check): that
// error wraps [backend.ErrUnavailable] and ctx.Err().
func New(ctx context.Context, nodes []goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return driver.Build(lo, limits, func() (backend.Driver, error) { return NewDriver(ctx, nodes, opts) })
}

// NewDriver is [New] without the Locker. It loads the scripts on the nodes
// that answer, and checks there that the client's user has every right
// the backend needs (see the package documentation, Permissions): a node
// whose user lacks one fails NewDriver with an error wrapping
// [backend.ErrInvalidConfig] that names the node, the right and the ACL
// SETUSER rule that grants it. A node that is down now, or does not answer
// within 4 × NodeTimeout (at least 2s), gets the scripts when it is first
// used, and is not checked (a warning is logged).
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
	case !(o.DriftFactor >= 0 && o.DriftFactor < 0.5): // NaN too
		return bad("DriftFactor %v: want 0 (default) up to 0.5", o.DriftFactor)
	case o.NodeTimeout < 0:
		return bad("negative NodeTimeout %v", o.NodeTimeout)
	case strings.ContainsAny(o.Prefix, "{}"):
		return bad("prefix %q contains '{' or '}' (the lock key is the Cluster hash tag)", o.Prefix)
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
		log:         slog.Default(),
	}
	if o.Locker != nil && o.Locker.Logger != nil {
		d.log = o.Locker.Logger
	}
	d.newHubs()
	for i, c := range d.nodes {
		d.disp = append(d.disp, newDispatcher(i, c))
	}
	if err := d.loadScripts(ctx, max(d.nodeTimeout*4, checkTimeout)); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// checkTimeout is the least time NewDriver gives the nodes to take the
// scripts and be checked (loadScripts): four script loads, a probe and a
// pub/sub connection's dial and two round trips take more than 4 ×
// NodeTimeout (200ms by default) on a loaded machine, and a user without a
// right must not open unchecked for that.
const checkTimeout = 2 * time.Second

// loadScripts loads the scripts on every node in parallel and checks the
// user's rights there (checkNode), waiting at most timeout; a node that has
// not got them by then gets them on first use (EVALSHA falls back to
// EVAL), unchecked, with a warning. It returns an error wrapping
// backend.ErrInvalidConfig naming every node that answered with a refusal.
func (d *Driver) loadScripts(parent context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	type result struct {
		node    int
		refused []redisscript.Refusal
	}
	done := make(chan result, len(d.nodes))
	for i, c := range d.nodes {
		d.bg.Go(func() { // Close waits for loads still on their way
			refused, err := d.checkNode(ctx, i, c)
			if err != nil {
				// A node that failed or did not answer in time is
				// worth a warning (its user's rights are unchecked);
				// a caller gone is not.
				level := slog.LevelWarn
				if parent.Err() != nil {
					level = slog.LevelDebug
				}
				d.log.Log(context.Background(), level, "dlock/redlock: a node did not take the scripts, or could not be checked, at start; it gets them on first use",
					"node", i, "error", err)
			}
			done <- result{i, refused}
		})
	}
	var errs []error
	for range d.nodes {
		select {
		case r := <-done:
			if len(r.refused) > 0 {
				errs = append(errs, redisscript.RightsError("redlock", d.nodeName(r.node), redisscript.User(d.nodes[r.node]), d.prefix, r.refused))
			}
		case <-ctx.Done():
			return errors.Join(errs...)
		}
	}
	return errors.Join(errs...)
}

// checkNode loads the scripts on node i (client c) and then checks that
// the user has every right the backend needs there: on a probe lock key
// under the prefix, which no lock uses, the scripts'
// commands, EVALSHA and EVAL, PUBLISH on its release channel (one more
// round trip, redisscript.CheckRights), and, in parallel, SUBSCRIBE and
// UNSUBSCRIBE of that channel on a pub/sub connection of its own (the
// node's hub's CheckSubscribe). It returns the refusals, and err for a
// failure that is not one (the network, an error reply that is not a
// refusal).
func (d *Driver) checkNode(ctx context.Context, i int, c goredis.UniversalClient) (refused []redisscript.Refusal, err error) {
	// A NUL, which no key may hold (backend.CheckKey): no lock of a user
	// is ever this key.
	lk := d.keys("\x00probe:" + newValue()[:16])[0]
	channel := lk + redisscript.ReleaseSuffix
	var (
		subErr error
		wg     sync.WaitGroup
	)
	wg.Go(func() { subErr = d.hubs[i].CheckSubscribe(ctx, channel) })
	defer func() {
		wg.Wait()
		if r, ok := redisscript.AsRefusal("subscribe", channel, subErr); ok {
			refused = append(refused, r)
		} else if err == nil {
			err = subErr
		}
	}()
	// One by one, not in a pipeline: go-redis's Script.Load sets the
	// Script's hash from the reply at once, "" from a queued command.
	for _, s := range redisscript.All {
		if e := s.Load(ctx, c).Err(); e != nil {
			if r, ok := redisscript.AsRefusal("script|load", "", e); ok {
				refused = append(refused, r)
				break
			}
			return refused, e
		}
	}
	more, err := redisscript.CheckRights(ctx, c, lk)
	return append(refused, more...), err
}

// nodeName is " on node i (addr)", for errors after a user's name.
func (d *Driver) nodeName(i int) string {
	if c, ok := d.nodes[i].(*goredis.Client); ok {
		return fmt.Sprintf(" on node %d (%s)", i, c.Options().Addr)
	}
	return fmt.Sprintf(" on node %d", i)
}

// warnUnannounced logs, at most once a minute, that node deleted a lock
// but could not publish its release.
func (d *Driver) warnUnannounced(node int, lockKey string) {
	now := time.Now().UnixNano()
	last := d.unannounced.Load()
	if last != 0 && now-last < int64(time.Minute) || !d.unannounced.CompareAndSwap(last, now) {
		return
	}
	d.log.Warn("dlock/redlock: a node deleted a lock, but could not publish the release to wake its waiters "+
		"(may the user publish to the channel there? ACL SETUSER <user> &"+d.prefix+"*); they find it free when they next poll "+
		"(logged at most once a minute)", "node", node, "key", lockKey, "channel", lockKey+redisscript.ReleaseSuffix)
}

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

// Limits: whole milliseconds; the TTL must leave room for the drift. Its
// DriftFactor is the driver's, so that the Locker's deadlines use it too.
func (d *Driver) Limits() backend.Limits {
	lim := limits
	lim.DriftFactor = d.drift
	return lim
}

// limits are the Driver's Limits, known before any I/O.
var limits = backend.Limits{MinTTL: 10 * time.Millisecond}

// Guarantees: best-effort tokens, a minority of nodes may fail, safety
// rests on timing, and no shared leases (Shared is false: see the package
// documentation, Shared leases).
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Backend:           "redlock",
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
			"Use etcd or ZooKeeper where correctness matters. " +
			"Shared leases (semaphores, readers) are not served: such acquires fail with ErrUnsupported before any I/O.",
	}
}

// As supports *[]goredis.UniversalClient (the nodes). From a
// *dlock.Locker: driver.LockerAs(locker, &nodes).
func (d *Driver) As(target any) bool {
	if p, ok := target.(*[]goredis.UniversalClient); ok {
		*p = d.nodes
		return true
	}
	return false
}

// Close closes the pub/sub connections of Watch (waking the watchers that
// remain), waits for the calls still on their way (the clean-ups of
// attempts and releases that returned before every node answered, token
// write-backs; each bounded by its per-node timeout), stops the per-node
// workers, and closes the clients if
// the driver built them from a URL. With a frozen node, the closing of its
// pub/sub connection is waited for at most 2s; it ends in the background.
func (d *Driver) Close() error {
	var errs []error
	d.closeOnce.Do(func() {
		d.closeWatches()
		d.bg.Close()
		d.bg.Wait()
		d.calls.Wait() // clean-ups and write-backs, each bounded by its deadline
		for _, p := range d.disp {
			p.close()
		}
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

// newValue returns a fresh ownership value without a holder: 16 random
// bytes, hex-encoded.
func newValue() string { return redisscript.NewValue("") }
