package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

// The scripts (internal/redisx/redisscript, shared with the redlock backend).
var (
	acquireScript     = redisscript.Acquire
	releaseScript     = redisscript.Release
	refreshScript     = redisscript.Refresh
	refreshManyScript = redisscript.RefreshMany

	// Shared leases (see the package documentation, Shared leases).
	acquireSharedScript     = redisscript.AcquireShared
	releaseSharedScript     = redisscript.ReleaseShared
	refreshSharedScript     = redisscript.RefreshShared
	refreshManySharedScript = redisscript.RefreshManyShared

	// The clean-ups of acquires given up (see the package documentation,
	// Acquires cut short).
	forsakeScript       = redisscript.Forsake
	forsakeSharedScript = redisscript.ForsakeShared
)

// Suffixes of the keys and channel that belong to one lock key.
const (
	fenceSuffix   = redisscript.FenceSuffix
	releaseSuffix = redisscript.ReleaseSuffix
	holdersSuffix = redisscript.HoldersSuffix
	tokensSuffix  = redisscript.TokensSuffix
)

// DefaultPrefix is the key prefix used when [Options].Prefix is empty.
const DefaultPrefix = "dlock:"

// DefaultFenceRetention is the [Options].FenceRetention used when it is 0.
const DefaultFenceRetention = 24 * time.Hour

// DefaultWaitTimeout is the WAIT timeout used when [Options].WaitReplicas > 0
// and [Options].WaitTimeout is 0.
const DefaultWaitTimeout = time.Second

// cleanupTimeout bounds the best-effort compare-and-delete that undoes an
// acquire whose outcome is unknown (a network error, a cancelled context) or
// unwanted (too few replicas acknowledged).
const cleanupTimeout = 2 * time.Second

// cutWindow is how long the tombstone a clean-up leaves keeps refusing
// the acquire it undoes, should that acquire reach the server later (see
// the package documentation, Acquires cut short). It outlasts go-redis's
// resends with its default timeouts (MaxRetries 3, ReadTimeout 5 s) and
// several TCP retransmissions of a command still in a socket's buffers.
const cutWindow = time.Minute

// cutWindowMillis is cutWindow in milliseconds, boxed once.
var cutWindowMillis any = cutWindow.Milliseconds()

// EvictionCheck says what [New] does when the server's maxmemory-policy
// allows it to evict keys, lock keys included.
type EvictionCheck int

const (
	// EvictionRefuse (the default) makes New fail with an error wrapping
	// [backend.ErrInvalidConfig] unless maxmemory-policy is "noeviction",
	// and also when it cannot be read (CONFIG GET refused by an ACL,
	// renamed or disabled, or answered with nothing).
	EvictionRefuse EvictionCheck = iota
	// EvictionWarn logs a warning and continues (also when the policy
	// cannot be read).
	EvictionWarn
	// EvictionIgnore skips the check (and the CONFIG GET round trip).
	EvictionIgnore
)

// String returns "refuse", "warn" or "ignore", the spellings the URL
// parameter eviction_check accepts.
func (e EvictionCheck) String() string {
	switch e {
	case EvictionRefuse:
		return "refuse"
	case EvictionWarn:
		return "warn"
	case EvictionIgnore:
		return "ignore"
	}
	return "EvictionCheck(" + strconv.Itoa(int(e)) + ")"
}

// Options configure the Redis backend. A nil *Options means all defaults.
type Options struct {
	// Prefix is prepended to every lock key, its fencing counter key and
	// its release channel. It must not contain "{" or "}" (the key itself
	// is the Cluster hash tag). Default [DefaultPrefix] ("dlock:"); an
	// empty Prefix means the default.
	Prefix string

	// WaitReplicas, when > 0, makes every acquire wait (Redis WAIT) until
	// this many replicas have acknowledged the lock; if fewer do within
	// WaitTimeout, the lock is released and the attempt fails with an
	// error wrapping [backend.ErrUnavailable] (TryAcquire reports it;
	// Acquire tries again, up to three failed attempts in a row, each waiting
	// up to WaitTimeout). Refreshes and releases do
	// not wait. Not allowed with a *goredis.ClusterClient (see the package
	// documentation). Every acquire's TTL must exceed WaitTimeout. Default
	// 0 (do not wait).
	WaitReplicas int
	// WaitTimeout is how long WAIT blocks for the replicas. It must be
	// below the client's ReadTimeout (go-redis's default is 5 s), and
	// the Locker's TTL (Locker.TTL, default backend.DefaultTTL) must exceed
	// it: New refuses a WaitTimeout that is not, before any I/O, with an
	// error wrapping [backend.ErrInvalidConfig] (and ErrInvalidTTL for the
	// TTL). Default [DefaultWaitTimeout] (1 s); ignored when WaitReplicas
	// is 0.
	WaitTimeout time.Duration

	// FenceRetention bounds the fencing counter keys: a grant whose token
	// is the server clock (the usual case; see the package documentation,
	// Fencing tokens) lets its lock key's counter expire FenceRetention
	// after the lock's TTL, counted from the grant. Every later token is
	// at least the server clock then, so the counter is needed only while
	// the clock might step back behind it: a shorter retention covers a
	// shorter step back. A counter ahead of the clock never expires (until
	// a later grant's token is the clock again). Negative: counters never
	// expire (one key per distinct lock name, forever). Default
	// [DefaultFenceRetention] (24 h).
	FenceRetention time.Duration

	// EvictionCheck says what New does when maxmemory-policy is not
	// "noeviction". Default [EvictionRefuse].
	EvictionCheck EvictionCheck

	// Locker configures the *dlock.Locker that [New] returns (default TTL,
	// retry bounds, ...). Default nil (dlock's defaults). Its Logger also
	// receives the backend's warnings (eviction policy, CONFIG
	// unavailable, a right that could not be checked, a release that
	// could not be published; default slog.Default()). NewDriver reads
	// that field, and TTL (checked against WaitTimeout).
	Locker *dlock.Options
}

// Driver is the Redis [backend.Driver]. It also implements
// [backend.Waiter] and [backend.BatchRefresher]. Most programs use [New], which wraps a Driver in a
// *dlock.Locker; NewDriver is for wrapping the driver yourself and for tests.
//
// A Driver is safe for concurrent use.
type Driver struct {
	client      goredis.UniversalClient
	ownsClient  bool
	prefix      string
	waitN       int
	waitTimeout time.Duration
	log         *slog.Logger

	// retention is FenceRetention in whole milliseconds (rounded up); 0
	// means counters never expire.
	retention int64
	lastTTL   atomic.Pointer[boxedTTL] // see ttlArgs

	evictionCheck EvictionCheck

	// unannounced is when a release that could not be published was
	// last logged (UnixNano; 0: never), see warnUnannounced.
	unannounced atomic.Int64

	hub  hub
	pipe pipe // shared pipelines for concurrent acquires and releases

	closeOnce sync.Once
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Waiter = (*Driver)(nil)
)

// shardIterator is implemented by *goredis.ClusterClient (and *goredis.Ring,
// which newDriver refuses).
type shardIterator interface {
	ForEachShard(ctx context.Context, fn func(ctx context.Context, client *goredis.Client) error) error
}

// NewDriver checks opts and the server's eviction policy (see
// [Options].EvictionCheck), loads the scripts, checks that the client's
// user has every right the backend needs (see the package documentation,
// Permissions), and returns the driver. It does not take ownership of
// client: [Driver.Close] leaves it open.
//
// Errors wrap [backend.ErrInvalidConfig] (bad options, a refused eviction
// policy, a right the user lacks, named with the ACL SETUSER rule that
// grants it; returned before any I/O where the options alone are wrong) or
// [backend.ErrUnavailable] (the server could not be reached).
func NewDriver(ctx context.Context, client goredis.UniversalClient, opts *Options) (*Driver, error) {
	d, err := newDriver(client, opts)
	if err != nil {
		return nil, err
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// newDriver validates the options and builds the driver without I/O.
func newDriver(client goredis.UniversalClient, opts *Options) (*Driver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis: nil client", backend.ErrInvalidConfig)
	}
	if _, ok := client.(*goredis.Ring); ok {
		return nil, fmt.Errorf("%w: redis: *goredis.Ring is not supported: a Ring rehashes keys to another shard when one looks unhealthy, "+
			"so two holders could take the same lock (and tokens could go backwards); use a single server, a failover client or a Cluster",
			backend.ErrInvalidConfig)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("%w: redis: prefix %q contains '{' or '}' (the lock key is the Cluster hash tag)", backend.ErrInvalidConfig, o.Prefix)
	}
	if o.WaitReplicas < 0 {
		return nil, fmt.Errorf("%w: redis: WaitReplicas %d is negative", backend.ErrInvalidConfig, o.WaitReplicas)
	}
	if o.WaitTimeout < 0 {
		return nil, fmt.Errorf("%w: redis: WaitTimeout %v is negative", backend.ErrInvalidConfig, o.WaitTimeout)
	}
	if o.WaitReplicas > 0 {
		if _, ok := client.(shardIterator); ok {
			return nil, fmt.Errorf("%w: redis: WaitReplicas needs a single-primary client (*goredis.Client or a failover client), not %T: "+
				"a cluster pipeline splits commands by key slot and WAIT has no key, so WAIT could not count the lock write",
				backend.ErrInvalidConfig, client)
		}
		if o.WaitTimeout == 0 {
			o.WaitTimeout = DefaultWaitTimeout
		}
		if o.WaitTimeout < time.Millisecond {
			return nil, fmt.Errorf("%w: redis: WaitTimeout %v is below 1ms (WAIT 0 would block forever)", backend.ErrInvalidConfig, o.WaitTimeout)
		}
		if rt, ok := readTimeout(client); ok && o.WaitTimeout >= rt {
			return nil, fmt.Errorf("%w: redis: WaitTimeout %v is not below the client's ReadTimeout %v: "+
				"the WAIT reply would time out the read, and go-redis would resend the acquire and WAIT; "+
				"lower WaitTimeout (wait_timeout) or raise ReadTimeout (read_timeout)",
				backend.ErrInvalidConfig, o.WaitTimeout, rt)
		}
		// Every acquire's TTL must exceed WaitTimeout: check the Locker's
		// default TTL now rather than at the first acquire.
		ttl := backend.DefaultTTL
		if o.Locker != nil && o.Locker.TTL > 0 {
			ttl = o.Locker.TTL
		}
		if ttl <= o.WaitTimeout {
			return nil, fmt.Errorf("%w (%w): redis: the Locker's TTL %v (ttl) is not longer than WaitTimeout %v (wait_timeout): "+
				"a lock could expire while WAIT blocks for the replicas", backend.ErrInvalidConfig, backend.ErrInvalidTTL, ttl, o.WaitTimeout)
		}
	}
	switch o.EvictionCheck {
	case EvictionRefuse, EvictionWarn, EvictionIgnore:
	default:
		return nil, fmt.Errorf("%w: redis: unknown EvictionCheck %d", backend.ErrInvalidConfig, int(o.EvictionCheck))
	}
	log := slog.Default()
	if o.Locker != nil && o.Locker.Logger != nil {
		log = o.Locker.Logger
	}
	var retention int64
	switch {
	case o.FenceRetention == 0:
		retention = DefaultFenceRetention.Milliseconds()
	case o.FenceRetention > 0:
		retention = int64((o.FenceRetention + time.Millisecond - 1) / time.Millisecond)
	}
	d := &Driver{
		client:      client,
		prefix:      o.Prefix,
		waitN:       o.WaitReplicas,
		waitTimeout: o.WaitTimeout,
		log:         log,
		retention:   retention,

		evictionCheck: o.EvictionCheck,
	}
	d.hub.init(d)
	d.pipe.init()
	return d, nil
}

// readTimeout returns the read timeout of a go-redis client that has one
// (a *goredis.Client, which failover clients are too; ok is false for a
// client without a read deadline and for other UniversalClients).
func readTimeout(client goredis.UniversalClient) (time.Duration, bool) {
	c, ok := client.(interface{ Options() *goredis.Options })
	if !ok {
		return 0, false
	}
	// go-redis normalises its options when the client is made: a
	// ReadTimeout ≤ 0 here means no read deadline.
	rt := c.Options().ReadTimeout
	return rt, rt > 0
}

// start does the I/O of NewDriver: the eviction check, script loading and
// the rights check.
func (d *Driver) start(ctx context.Context) error {
	if err := d.checkEviction(ctx); err != nil {
		return err
	}
	for _, s := range []*goredis.Script{acquireScript, releaseScript, refreshScript, refreshManyScript,
		acquireSharedScript, releaseSharedScript, refreshSharedScript, refreshManySharedScript} {
		if err := s.Load(ctx, d.client).Err(); err != nil {
			if r, ok := redisscript.AsRefusal("script|load", "", err); ok {
				return d.refused([]redisscript.Refusal{r})
			}
			return fmt.Errorf("%w: redis: loading scripts: %w", backend.ErrUnavailable, err)
		}
	}
	return d.checkRights(ctx)
}

// checkRights checks that the client's user may run what the backend runs
// (see the package documentation, Permissions): on a probe lock key under
// the prefix, which no lock uses, the scripts' commands, EVALSHA and EVAL,
// its release channel (PUBLISH, from the probe script; SUBSCRIBE and
// UNSUBSCRIBE, on a connection of its own), the commands of the shared
// lease scripts on the probe key's holders and tokens keys, and WAIT when WaitReplicas >
// 0. Without such a check a user without channel rights (Redis 7's default
// for a new ACL user) would open fine, its waiters would each fall back to
// polling, and its releases would not be published. It costs one
// pipelined round trip and, in parallel, a pub/sub connection's dial and
// two round trips, once per NewDriver. A right refused is an error
// wrapping backend.ErrInvalidConfig that names it; a check the server
// cannot run (an error reply that is not a refusal: a proxy, an old
// server) is logged and skipped.
func (d *Driver) checkRights(ctx context.Context) error {
	// A NUL, which no key may hold (backend.CheckKey): no lock of a user
	// is ever this key.
	lk := d.lockKey("\x00probe:" + newValue()[:16])
	channel := lk + releaseSuffix
	var extra [][]any
	if d.waitN > 0 {
		extra = append(extra, []any{"wait", 0, 1}) // 0 replicas: answered at once
	}
	var (
		subErr error
		wg     sync.WaitGroup
	)
	wg.Go(func() { subErr = d.hub.h.CheckSubscribe(ctx, channel) })
	refused, err := redisscript.CheckRightsShared(ctx, d.client, lk, extra...)
	wg.Wait()
	if r, ok := redisscript.AsRefusal("subscribe", channel, subErr); ok {
		refused = append(refused, r)
	}
	if len(refused) > 0 {
		return d.refused(refused)
	}
	if err != nil && !isServerError(err) {
		return fmt.Errorf("%w: redis: checking the user's rights: %w", backend.ErrUnavailable, err)
	}
	if subErr != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: redis: checking the user's rights: %w", backend.ErrUnavailable, ctx.Err())
	}
	for _, e := range []error{err, subErr} {
		if e != nil {
			d.log.Warn("dlock/redis: could not check every right the backend needs (see the package documentation, Permissions)", "error", e)
		}
	}
	return nil
}

// refused is the error of NewDriver for rights the user lacks.
func (d *Driver) refused(rs []redisscript.Refusal) error {
	return redisscript.RightsError("redis", "", redisscript.User(d.client), d.prefix, rs)
}

// checkEviction reads maxmemory-policy from every server the client writes
// to and applies the configured EvictionCheck.
func (d *Driver) checkEviction(ctx context.Context) error {
	if d.evictionCheck == EvictionIgnore {
		return nil
	}
	type result struct {
		addr, policy string
		err          error
	}
	var (
		mu      sync.Mutex
		results []result
	)
	get := func(ctx context.Context, c goredis.Cmdable, addr string) error {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		mu.Lock()
		results = append(results, result{addr, m["maxmemory-policy"], err})
		mu.Unlock()
		if err != nil && !isServerError(err) {
			return err
		}
		return nil
	}
	var err error
	if si, ok := d.client.(shardIterator); ok {
		err = si.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error {
			return get(ctx, c, c.Options().Addr)
		})
	} else {
		err = get(ctx, d.client, "")
	}
	if err != nil {
		return fmt.Errorf("%w: redis: reading maxmemory-policy: %w", backend.ErrUnavailable, err)
	}
	for _, r := range results {
		where := ""
		if r.addr != "" {
			where = " on " + r.addr
		}
		if (r.err != nil || r.policy == "") && d.evictionCheck == EvictionRefuse {
			const fix = "; it cannot be checked that the server never evicts lock keys: allow this client CONFIG GET " +
				"(for an ACL user: ACL SETUSER <user> +config|get), or, if maxmemory-policy is noeviction, " +
				"set EvictionCheck to warn or ignore (URL parameter eviction_check=warn or ignore)"
			if r.err != nil {
				return fmt.Errorf("%w: redis: CONFIG GET maxmemory-policy%s failed: %w"+fix, backend.ErrInvalidConfig, where, r.err)
			}
			return fmt.Errorf("%w: redis: CONFIG GET maxmemory-policy%s returned nothing"+fix, backend.ErrInvalidConfig, where)
		}
		switch {
		case r.err != nil:
			d.log.Warn("dlock/redis: cannot check maxmemory-policy (CONFIG GET failed); if the server may evict keys, locks can be lost",
				"addr", r.addr, "error", r.err)
		case r.policy == "":
			d.log.Warn("dlock/redis: cannot check maxmemory-policy (CONFIG GET returned nothing); if the server may evict keys, locks can be lost",
				"addr", r.addr)
		case r.policy != "noeviction":
			if d.evictionCheck == EvictionRefuse {
				return fmt.Errorf("%w: redis: maxmemory-policy is %q%s, so the server may evict lock keys and grant a lock twice; "+
					"run CONFIG SET maxmemory-policy noeviction (and persist it in redis.conf), or set EvictionCheck to warn or ignore",
					backend.ErrInvalidConfig, r.policy, where)
			}
			d.log.Warn("dlock/redis: maxmemory-policy allows evicting lock keys; set it to noeviction",
				"addr", r.addr, "maxmemory-policy", r.policy)
		}
	}
	return nil
}

// isServerError reports whether err is an error reply from the server (as
// opposed to a network or context error).
func isServerError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

// unavailable wraps an error from go-redis so that it matches
// backend.ErrUnavailable (and still matches the go-redis or context error).
func unavailable(err error) error {
	return fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, err)
}

// lockKey maps a dlock key to the Redis lock key.
func (d *Driver) lockKey(key string) string {
	return d.prefix + "{" + key + "}"
}

// ValidateKey rejects keys that begin with "}": the lock key would start its
// hash tag with "{}", which Redis Cluster treats as no hash tag, putting the
// lock key and its counter in different slots. The error wraps
// [backend.ErrInvalidKey].
func (d *Driver) ValidateKey(key string) error {
	if strings.HasPrefix(key, "}") {
		return fmt.Errorf("%w: redis: the key begins with '}' (it would make an empty Cluster hash tag)", backend.ErrInvalidKey)
	}
	return nil
}

// Limits returns MinTTL 1 ms (Redis expires in whole milliseconds) and no
// MaxTTL.
func (d *Driver) Limits() backend.Limits { return limits }

// limits are the Driver's Limits, known before any I/O.
var limits = backend.Limits{MinTTL: time.Millisecond}

// Guarantees reports best-effort fencing, no tolerated failures, no FIFO,
// a clock-dependent lease, and shared leases (semaphores and read-write
// locks; see the package documentation, Shared leases).
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Backend:           "redis",
		Fencing:           backend.FencingBestEffort,
		ToleratedFailures: 0,
		FIFO:              false,
		Shared:            true,
		ClockDependent:    true,
		Notes: "A failover to a replica that missed the lock (replication is asynchronous), a restart that loses it " +
			"(no persistence, or writes not yet on disk), a process pause longer than the TTL or a clock jump can let two " +
			"holders overlap. Each token is the larger of the server's counter + 1 and its clock in microseconds, " +
			"written back to the counter. A token can equal or go below an earlier one only if the counter was lost or " +
			"came back stale (a restart without persistence, or from a snapshot or an appendfsync everysec file that " +
			"missed the last grants; a failover to a replica that missed them; an eviction; a DEL; its expiry, " +
			"FenceRetention after the lock's TTL when the grant's token was the clock) and the serving " +
			"server's clock reads behind that earlier token: stepped back by more than the time since that grant (an " +
			"outage included), behind the old primary's clock by more than the time between the two grants (a promoted " +
			"replica), or behind a token that came from a counter set ahead of the clock (by hand, or by a server with " +
			"a faster clock). " +
			"Shared leases (semaphores, readers) share these limits and the token counter; their waiters in different " +
			"processes are served in no set order, and a waiting writer keeps new readers out only while it keeps trying " +
			"(for 2 × RetryMax after each attempt).",
	}
}

// As sets *target to the driver's client when target is a
// *goredis.UniversalClient, and reports whether it did. From a
// *dlock.Locker: driver.LockerAs(locker, &client).
func (d *Driver) As(target any) bool {
	if p, ok := target.(*goredis.UniversalClient); ok {
		*p = d.client
		return true
	}
	return false
}

// Close stops the driver's pub/sub connection (waking any remaining
// waiters) and its pipeline flushers (failing the queued acquires and
// releases still in flight; see the package documentation, Concurrent
// callers) and, if the driver built the client itself from a URL, closes
// the client. A client passed to [New] or [NewDriver] stays open.
func (d *Driver) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.hub.close()
		d.pipe.close()
		if d.ownsClient {
			if cerr := d.client.Close(); cerr != nil {
				err = fmt.Errorf("%w: redis: closing the client: %w", backend.ErrUnavailable, cerr)
			}
		}
	})
	return err
}

// newValue returns a fresh ownership value without a holder: 16 random
// bytes, hex-encoded.
func newValue() string { return redisscript.NewValue("") }

// ttlMillis truncates ttl to whole milliseconds.
func ttlMillis(ttl time.Duration) (int64, error) {
	ms := int64(ttl / time.Millisecond)
	if ms < 1 {
		return 0, fmt.Errorf("%w: redis: %v is below 1ms", backend.ErrInvalidTTL, ttl)
	}
	return ms, nil
}

// TryAcquire makes one attempt to take the lock, in one round trip: one
// EVALSHA of acquire.lua (SET key value NX PX ttl GET, the value carrying
// req.Holder before the grant's ownership part, and, when the SET
// took the lock, the token: the larger of the key's fencing counter + 1
// and the server clock in microseconds, written back to the counter),
// followed in the same pipeline by WAIT when WaitReplicas > 0 (without
// WaitReplicas, while other acquires or releases of the driver are in
// flight, the EVALSHA shares a pipeline with theirs; see the package
// documentation, Concurrent callers). The script
// is safe to run twice: when go-redis resends it after a lost reply, the
// second run finds the lock ours, writes the counter again (so that WAIT
// waits for the lock to reach the replicas) and returns the same token. A TTL that is not a whole number of
// milliseconds is truncated down; the lease reports the truncated TTL.
//
// An attempt of a waiting Acquire (req.Wait > 0) also passes req.Wait, in
// whole milliseconds, to acquire.lua: if it finds the key held by shared
// leases, it keeps new shared leases out for that long (see the package
// documentation, Shared leases). A shared request (req.Shared) runs
// acquireshared.lua instead, the same way; one whose Permits differ from
// those of the key's holders returns a *[backend.PermitsError], having
// taken nothing.
//
// When the key is held it returns a *[backend.HeldError] whose RetryAfter is
// the holder's remaining PTTL (0 if the key has no expiry; for a shared
// request on a full semaphore or behind a waiting writer, the time until
// the first shared holder expires; for a writer behind shared holders, the
// time until the last of them expires; at least 1 ms otherwise). On a
// network error, a cancelled ctx or too few replicas it cleans up after
// this attempt: it deletes the lock again if the attempt took it, and
// leaves a tombstone that refuses the attempt if it reaches the server
// only later (best effort, bounded by a short timeout that ignores ctx's
// cancellation, on a client whose ContextTimeoutEnabled is set; see the
// package documentation, Acquires cut short) and returns an error
// wrapping [backend.ErrUnavailable].
func (d *Driver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	key, ttl := req.Key, req.TTL
	ms, err := ttlMillis(ttl)
	if err != nil {
		return nil, err
	}
	if d.waitN > 0 && ttl <= d.waitTimeout {
		// The lock could expire while WAIT blocks.
		return nil, fmt.Errorf("%w: redis: TTL %v is not longer than WaitTimeout %v", backend.ErrInvalidTTL, ttl, d.waitTimeout)
	}
	if req.Shared {
		return d.tryAcquireShared(ctx, req, ms)
	}
	// One allocation for both keys: the lock key is a prefix of the
	// counter key.
	fk := d.prefix + "{" + key + "}" + fenceSuffix // d.lockKey(key) + fenceSuffix
	lk := fk[:len(fk)-len(fenceSuffix)]
	l := &lease{d: d, keys: [2]string{lk, fk}, ttl: time.Duration(ms) * time.Millisecond}
	// The script arguments live in the lease, boxed once: the value is
	// sent again by Release and Refresh. It carries the holder
	// description before the ownership part (redisscript.NewValue;
	// without a holder, the ownership part alone, at no extra cost).
	ta := d.ttlArgs(ms)
	l.args = [4]any{redisscript.NewValue(req.Holder), ta.ms}
	args := l.args[:2]
	if d.retention > 0 {
		// No clock in the reply; the counter's TTL when the token is
		// the clock.
		l.args[2], l.args[3] = "", ta.counter
		args = l.args[:4]
	}
	if req.Wait > 0 {
		// An attempt of a waiting Acquire: a writer, which keeps new
		// shared leases out for Wait if it finds the key held by
		// them (acquire.lua's ARGV[5]; "" for an ARGV[4] not set).
		counter := l.args[3]
		if counter == nil {
			counter = ""
		}
		args = []any{l.args[0], l.args[1], "", counter, waitMillis(req.Wait)}
	}
	return d.grant(ctx, l, acquireScript, l.keys[:], args)
}

// waitMillis is a Request.Wait in whole milliseconds, rounded up.
func waitMillis(w time.Duration) int64 {
	return int64((w + time.Millisecond - 1) / time.Millisecond)
}

// grant runs the acquire script s (acquire.lua or acquireshared.lua) of
// the lease l with keys and args and makes l the grant, or returns why
// not: a *backend.HeldError, a *backend.PermitsError (acquireshared.lua),
// or a failure wrapping backend.ErrUnavailable, after deleting what the
// attempt may have taken.
func (d *Driver) grant(ctx context.Context, l *lease, s *goredis.Script, keys []string, args []any) (backend.Lease, error) {
	var (
		res   int64
		cut   *pending
		err   error
		waitN = int64(d.waitN)
	)
	if d.waitN > 0 {
		// Never pipelined: WAIT must follow the script on its
		// connection.
		res, waitN, err = d.acquireWait(ctx, s, keys, args)
	} else {
		res, cut, err = d.script(ctx, s, keys, args)
	}
	if err != nil {
		if held, ok := redisscript.HeldPermits(err); ok && l.shared != nil {
			// Nothing was taken (acquireshared.lua).
			return nil, &backend.PermitsError{Asked: l.shared.permits, Held: held}
		}
		l.cleanupAfter(ctx, cut)
		return nil, unavailable(err)
	}
	if res < 0 {
		pttl := max(-2-res, 0) // -1 (no expiry) counts as unknown
		return nil, &backend.HeldError{RetryAfter: time.Duration(pttl) * time.Millisecond}
	}
	if waitN < int64(d.waitN) {
		l.cleanup(ctx)
		return nil, fmt.Errorf("%w: redis: WAIT: %d of %d replicas acknowledged within %v; lock released",
			backend.ErrUnavailable, waitN, d.waitN, d.waitTimeout)
	}
	l.token = uint64(res)
	return l, nil
}

// boxedTTL holds a TTL's script arguments, boxed once: the TTL in ms and
// the counter's TTL (the TTL + the retention).
type boxedTTL struct {
	n           int64
	ms, counter any
}

// ttlArgs returns the boxed arguments for a TTL of ms milliseconds, from
// the last TTL's if it is the same (saving two allocations per acquire).
func (d *Driver) ttlArgs(ms int64) *boxedTTL {
	if b := d.lastTTL.Load(); b != nil && b.n == ms {
		return b
	}
	b := &boxedTTL{n: ms, ms: ms, counter: ms + d.retention}
	d.lastTTL.Store(b)
	return b
}

// acquireWait sends the acquire script s (acquire.lua or
// acquireshared.lua) and WAIT in one pipeline (one connection, as WAIT
// requires) and returns the script's reply and the number of replicas
// that acknowledged.
func (d *Driver) acquireWait(ctx context.Context, s *goredis.Script, keys []string, args []any) (res, waitN int64, err error) {
	run := func(eval bool) (*goredis.Cmd, *goredis.Cmd) {
		pipe := d.client.Pipeline()
		var ev *goredis.Cmd
		if eval {
			ev = s.Eval(ctx, pipe, keys, args...)
		} else {
			ev = s.EvalSha(ctx, pipe, keys, args...)
		}
		// Pipeliner has no Wait method; the reply is read with the
		// client's ReadTimeout, hence WaitTimeout < ReadTimeout.
		wt := pipe.Do(ctx, "wait", d.waitN, d.waitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx) // the errors are in the commands
		return ev, wt
	}
	ev, wt := run(false)
	if goredis.HasErrorPrefix(ev.Err(), "NOSCRIPT") {
		ev, wt = run(true)
	}
	if res, err = ev.Int64(); err != nil {
		return 0, 0, err
	}
	if waitN, err = wt.Int64(); err != nil {
		return 0, 0, err
	}
	return res, waitN, nil
}

// lease is one grant.
type lease struct {
	d     *Driver
	keys  [2]string // lock key, counter key
	args  [4]any    // acquire.lua's ARGV: lock value (string: holder + ownership part), TTL in ms (int64), "", counter TTL in ms (int64)
	token uint64
	ttl   time.Duration
	// shared is set for a shared lease (nil for an exclusive one,
	// keeping the struct in its size class).
	shared *sharedLease
}

// sharedLease is what a shared lease has beyond an exclusive one.
type sharedLease struct {
	// keys are the lock key, its holders and tokens keys (the KEYS of
	// releaseshared.lua and refreshshared.lua) and the counter key (the
	// fourth of acquireshared.lua's).
	keys    [4]string
	permits int // backend.Request.Permits
}

// releaser returns the script that releases l and its keys.
func (l *lease) releaser() (*goredis.Script, []string) {
	if l.shared != nil {
		return releaseSharedScript, l.shared.keys[:3]
	}
	return releaseScript, l.keys[:1]
}

// forsaker returns the script that cleans up after l's acquire, given up
// (forsake.lua or forsakeshared.lua: l's release, if the acquire took l,
// and a tombstone that refuses the acquire if it arrives later), its keys
// and its arguments.
func (l *lease) forsaker() (*goredis.Script, []string, []any) {
	args := []any{l.args[0], cutWindowMillis}
	if l.shared != nil {
		return forsakeSharedScript, l.shared.keys[:], args
	}
	return forsakeScript, l.keys[:], args
}

// tryAcquireShared is TryAcquire of a shared lease (req.Shared), with its
// TTL in whole milliseconds: one EVALSHA of acquireshared.lua (see the
// package documentation, Shared leases), shared pipelines and WAIT as for
// an exclusive acquire.
func (d *Driver) tryAcquireShared(ctx context.Context, req backend.Request, ms int64) (backend.Lease, error) {
	lk := d.lockKey(req.Key)
	sh := &sharedLease{keys: [4]string{lk, lk + holdersSuffix, lk + tokensSuffix, lk + fenceSuffix}, permits: req.Permits}
	l := &lease{d: d, keys: [2]string{lk, sh.keys[3]}, ttl: time.Duration(ms) * time.Millisecond, shared: sh}
	ta := d.ttlArgs(ms)
	l.args[0], l.args[1] = redisscript.NewValue(req.Holder), ta.ms
	counter := any("") // no expiry
	if d.retention > 0 {
		counter = ta.counter
	}
	args := []any{l.args[0], ta.ms, strconv.Itoa(req.Permits), counter}
	return d.grant(ctx, l, acquireSharedScript, sh.keys[:], args)
}

var _ backend.Lease = (*lease)(nil)

func (l *lease) Token() uint64      { return l.token }
func (l *lease) TTL() time.Duration { return l.ttl }

// Refresh sets the lock's TTL to ttl (truncated to whole milliseconds) from
// now if the lock is still ours, and returns the truncated TTL.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) (time.Duration, error) {
	ms, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	s, keys := refreshScript, l.keys[:1]
	if l.shared != nil {
		s, keys = refreshSharedScript, l.shared.keys[:3]
	}
	n, err := s.Run(ctx, l.d.client, keys, l.args[0], ms).Int64()
	if err != nil {
		return 0, unavailable(err)
	}
	if n != 1 {
		return 0, errNotHeld
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Release deletes the lock if it is still ours and wakes its waiters. A
// lock deleted whose release could not be published (the user may not
// publish to its channel) is released: Release returns nil and logs a
// warning (see warnUnannounced); its waiters find it free when they next
// poll.
func (l *lease) Release(ctx context.Context) error {
	s, keys := l.releaser()
	n, _, err := l.d.script(ctx, s, keys, l.args[:1])
	if err != nil {
		return unavailable(err)
	}
	switch n {
	case 1:
		return nil
	case redisscript.ReleasedUnannounced:
		l.d.warnUnannounced(l.keys[0])
		return nil
	}
	return errNotHeld
}

// warnUnannounced logs, at most once a minute, that a lock was released
// but its release could not be published.
func (d *Driver) warnUnannounced(lockKey string) {
	now := time.Now().UnixNano()
	last := d.unannounced.Load()
	if last != 0 && now-last < int64(time.Minute) || !d.unannounced.CompareAndSwap(last, now) {
		return
	}
	d.log.Warn("dlock/redis: a lock was released, but the release could not be published to wake its waiters "+
		"(may the user publish to the channel? ACL SETUSER <user> &"+d.prefix+"*); they find it free when they next poll "+
		"(logged at most once a minute)", "key", lockKey, "channel", lockKey+releaseSuffix)
}

var errNotHeld = fmt.Errorf("%w: redis: the lock key is gone or has another owner", backend.ErrNotHeld)

// cleanup undoes this grant's acquire, ignoring errors, with a short
// timeout that ignores the cancellation of ctx: it deletes the lock (or
// ends the shared lease) if the acquire took it, and leaves a tombstone
// that refuses the acquire should it reach the server only now (forsaker;
// see the package documentation, Acquires cut short). The acquire and the
// clean-up may thus reach the server in either order.
func (l *lease) cleanup(ctx context.Context) { l.cleanupAfter(ctx, nil) }

// cleanupAfter is cleanup after an acquire queued for the driver's shared
// pipelines whose wait ctx cut short (cut, when not nil): it first waits
// for that acquire to run, and cleans up nothing if the acquire found the
// lock held by another. The wait and the clean-up share the one timeout;
// if the acquire's pipeline has not run when it ends (a slow server, or
// go-redis resending the pipeline after a lost reply), the clean-up is
// left to the flusher, which sends it once the pipeline has run.
func (l *lease) cleanupAfter(ctx context.Context, cut *pending) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if cut != nil {
		res, ran, err := cut.wait(ctx)
		if !ran {
			if cut.abandon(l) {
				return // the flusher deletes it
			}
			// It ran meanwhile, as the timeout ended: delete with a
			// fresh timeout.
			res, err = cut.c.cmd.Int64()
			cancel()
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
		}
		if err == nil && res < 0 {
			return // held by another: not ours to delete
		}
	}
	s, keys, args := l.forsaker()
	_ = s.Run(ctx, l.d.client, keys, args...).Err()
}
