package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bg"
)

// DefaultPrefix is the key prefix used when [Options].Prefix is empty.
const DefaultPrefix = "dlock/"

// cleanupTimeout bounds the best-effort revoke that undoes an acquire that
// failed, was cancelled, or found the key held.
const cleanupTimeout = 2 * time.Second

// DefaultRequestTimeout is the request timeout used when
// [Options].RequestTimeout is 0.
const DefaultRequestTimeout = 5 * time.Second

// watchRetryPause is the pause before a waiter reads its queue again after
// its watch broke.
const watchRetryPause = 50 * time.Millisecond

// maxTTL is etcd's longest lease (its MaxLeaseTTL, 9e9 seconds).
const maxTTL = 9_000_000_000 * time.Second

// Options configure the etcd backend. The zero value (or nil) is valid.
type Options struct {
	// Prefix is put before every etcd key the backend uses; it must end
	// with "/" (else "app" and "app2" would share keys, and a role
	// granted "app" would cover "app2"). Default DefaultPrefix
	// ("dlock/"). Lockers that are to exclude each other must use the
	// same prefix. With authentication on, the user needs a role that
	// may read and write the whole prefix (etcdctl role
	// grant-permission ROLE readwrite --prefix=true dlock/): [New]
	// checks it, and refuses with ErrInvalidConfig.
	Prefix string
	// RequestTimeout bounds each request to the cluster: the member list
	// [New] reads, and every grant, transaction and read of Acquire,
	// TryAcquire, Refresh and Release. The etcd client retries a request
	// while no member answers (and a member that has lost its quorum
	// answers only after its own request timeout, if at all), so without
	// this bound a call without a ctx deadline would wait until the
	// cluster serves again. A request not answered in time fails with
	// ErrUnavailable; ctx's deadline, if earlier, ends it first. Waiting
	// in the queue is not bounded by it (see [Driver.Acquire]); the
	// requests a waiter makes while queued are bounded by a third of its
	// TTL (at least 1s) where that is shorter, and sent again. Default
	// [DefaultRequestTimeout] (5s); negative is an error.
	RequestTimeout time.Duration
	// Locker configures the Locker that [New] returns (TTL, retries,
	// drift factor, logger). Nil means defaults. Its Logger also receives
	// the backend's warnings (a broken watch on the prefix; default
	// slog.Default()): the one field NewDriver reads. A client that
	// dlock.Open builds from a URL logs there too, as "dlock/etcd: client:"
	// lines (at Debug until its first round trip is answered); a client
	// of your own logs where its Config.Logger says.
	Locker *dlock.Options
}

// Driver is the etcd implementation of backend.Driver, backend.Queuer,
// backend.BatchRefresher, backend.Inspector, backend.ChangeWatcher and the
// As escape hatch. Use [New] unless you wrap drivers yourself.
//
// Every acquire stores its holder description (backend.Request.Holder) as
// the value of its key, in the transaction that puts the key in the queue:
// the description is there from the grant on, and Inspect returns the
// queue head's. [Driver.WatchChanges] watches one lock's queue (one etcd
// watch on its directory), so that an observer of the lock, such as an
// election's follower, learns of a new holder without polling.
type Driver struct {
	client     *clientv3.Client
	prefix     string
	timeout    time.Duration // of each request
	members    int
	minGrant   time.Duration // the server's least lease TTL, learned by NewDriver
	ownsClient bool
	log        *slog.Logger

	ctx    context.Context // cancelled by Close: ends the watches and the keepalive stream
	cancel context.CancelFunc
	// closing is closed when Close begins: a revoke retried in the
	// background makes its last attempt then. revokeCtx bounds every
	// background revoke; Close ends it cleanupTimeout after it began.
	closing   chan struct{}
	revokeCtx context.Context
	revokeEnd context.CancelFunc

	once sync.Once
	bg   bg.Group // the watches, the keepalive stream's receiver, revokes; Close waits for them

	ka   keeper // the one keepalive stream
	pool pool   // idle leases, by TTL

	hubsMu   sync.Mutex
	hubs     map[hubKey]*hubEntry // the watches: losses and wake-ups (see hubFor)
	hubsMade int                  // the hubs made so far (tests)
	// maxDirWatches is the most directory hubs before the prefix hub
	// serves the directories beyond (the package's maxDirWatches).
	maxDirWatches int
	watchLinger   time.Duration // how long a directory hub no longer in use lingers (the package's watchLinger)

	watchEvents  atomic.Int64                  // the events the watches received (tests)
	watchWarned  atomic.Int64                  // when a broken watch was last logged (Unix ns; see warnWatch)
	beforeWatch  atomic.Pointer[func()]        // tests: called before each watch is made
	watchCreated atomic.Pointer[chan struct{}] // tests: receives (if there is room) when a watch is created

	afterQueueRead func()            // tests: called between a waiter's queue read and its watch
	afterMove      func(error) error // tests: sees, and may replace, the outcome of Refresh's move transaction
	// holdMove (tests) is called before Refresh sends a move transaction
	// to lease to, with a commit that sends exactly that transaction; if
	// it returns an error, the move is not sent and fails with it (its
	// outcome unknown to us, while the test may commit it later).
	holdMove func(to clientv3.LeaseID, commit func(context.Context) (bool, error)) error
	// fault (tests) is asked before each request named by doing (id is
	// the lease of a revoke, else 0); an error it returns fails the
	// request unsent.
	fault atomic.Pointer[func(doing string, id clientv3.LeaseID) error]
}

// New checks opts, asks the cluster for its member list (to report how
// many failures it tolerates) and for a probe lease (to learn the least TTL
// it grants), checks that the client may read, write and delete the keys
// under the prefix (a transaction that changes nothing), and returns a
// Locker over client configured by opts.Locker (whose Logger the backend
// logs to as well). Each of these requests is bounded by
// opts.RequestTimeout; a probe lease that cannot be revoked is left to run
// out (seconds). It does not take ownership of client: closing the Locker
// leaves the client open. Errors wrap [backend.ErrInvalidConfig] (bad
// options, opts.Locker included, before any I/O; a missing right on the
// prefix, naming the grant to make) or
// [backend.ErrUnavailable].
func New(ctx context.Context, client *clientv3.Client, opts *Options) (*dlock.Locker, error) {
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return driver.Build(lo, limits, func() (backend.Driver, error) { return NewDriver(ctx, client, opts) })
}

// NewDriver is [New] without the Locker: it returns the backend driver, for
// callers that wrap it (driver.New(d, opts) makes the Locker).
func NewDriver(ctx context.Context, client *clientv3.Client, opts *Options) (*Driver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcd: nil client", backend.ErrInvalidConfig)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Prefix == "":
		o.Prefix = DefaultPrefix
	case !strings.HasSuffix(o.Prefix, "/"):
		// "app" would share its keys' directories with "app2" ("app"+"2x"
		// and "app2"+"x"), and a role granted the prefix "app" would
		// cover "app2".
		return nil, fmt.Errorf("%w: etcd: Prefix %q does not end with \"/\" (want such as %q)", backend.ErrInvalidConfig, o.Prefix, o.Prefix+"/")
	}
	switch {
	case o.RequestTimeout < 0:
		return nil, fmt.Errorf("%w: etcd: negative RequestTimeout %v", backend.ErrInvalidConfig, o.RequestTimeout)
	case o.RequestTimeout == 0:
		o.RequestTimeout = DefaultRequestTimeout
	}
	d := &Driver{client: client, prefix: o.Prefix, timeout: o.RequestTimeout, log: slog.Default()}
	if o.Locker != nil && o.Locker.Logger != nil {
		d.log = o.Locker.Logger
	}
	resp, err := call(ctx, d, "listing the cluster members", func(ctx context.Context) (*clientv3.MemberListResponse, error) {
		return client.MemberList(ctx)
	})
	if err != nil {
		return nil, err
	}
	d.members = len(resp.Members)
	// The server raises a TTL below its floor (about 1.5 × its election
	// timeout). Learn it with a 1s grant, so that the Locker keeps an
	// auto-refreshed lease within MaxHold (Limits.MinGrant).
	g, err := call(ctx, d, "granting a probe lease", func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return client.Grant(ctx, 1)
	})
	if err != nil {
		return nil, err
	}
	d.minGrant = time.Duration(g.TTL) * time.Second
	// A failed revoke is harmless: the probe lease has no key and runs
	// out by itself within seconds.
	_, _ = call(ctx, d, "revoking the probe lease", func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) {
		return client.Revoke(ctx, g.ID)
	})
	if err := d.checkAccess(ctx); err != nil {
		return nil, err
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.closing = make(chan struct{})
	d.revokeCtx, d.revokeEnd = context.WithCancel(context.Background())
	d.ka.d = d
	d.hubs = map[hubKey]*hubEntry{}
	d.maxDirWatches = int(maxDirWatches.Load())
	d.watchLinger = time.Duration(watchLinger.Load())
	return d, nil
}

// accessProbe is the key, under the prefix, of checkAccess's transaction
// (which never writes it).
const accessProbe = "\x00dlock-access-check"

// checkAccess asks the cluster whether the client may read, write and
// delete the keys under the prefix, in one transaction that changes
// nothing: etcd checks the rights for both branches of a transaction
// before it evaluates the comparison, which here is never true. A missing
// right is an ErrInvalidConfig that names the user, the prefix and the
// grant to make (without it the watches would fail for as long as the
// Driver lives, and every acquire with them).
func (d *Driver) checkAccess(ctx context.Context) error {
	probe := d.prefix + accessProbe
	_, err := call(ctx, d, "checking the rights on the prefix", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(probe), "<", 0)).
			Then(clientv3.OpPut(probe, ""), clientv3.OpDelete(probe+"/")). // one key may not be both
			Else(clientv3.OpGet(d.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))).
			Commit()
	})
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		who := "the client"
		if d.client.Username != "" {
			who = fmt.Sprintf("user %q", d.client.Username)
		}
		return fmt.Errorf("%w: etcd: %s may not read, write and delete the keys under prefix %q (%w); "+
			"give one of its roles the range: etcdctl role grant-permission ROLE readwrite --prefix=true %s",
			backend.ErrInvalidConfig, who, d.prefix, rpctypes.ErrPermissionDenied, d.prefix)
	}
	return err
}

// escapeKey makes a lock name usable as one etcd key segment: "%" and "/"
// are percent-encoded, so that no lock's directory is a prefix of another's
// ("a" and "a/b" become "a/" and "a%2Fb/").
func escapeKey(key string) string {
	if !strings.ContainsAny(key, "%/") {
		return key
	}
	return keyEscaper.Replace(key)
}

// keyEscaper is escapeKey's replacer, built once (building one per call
// was 3% of a lock cycle's client CPU on keys with a "/").
var keyEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// dir returns the etcd key prefix under which key's holder and waiters
// queue.
func (d *Driver) dir(key string) string { return d.prefix + escapeKey(key) + "/" }

// ValidateKey accepts every key the dlock layer accepts: keys are escaped.
func (d *Driver) ValidateKey(string) error { return nil }

// Limits: etcd leases are whole seconds (Resolution), at least 1s. The
// server raises a TTL below its own floor (about 1.5 × its election timeout,
// 2s with the default settings) to that floor, which NewDriver learns from a
// probe grant (MinGrant); Lease.TTL reports what it granted.
func (d *Driver) Limits() backend.Limits {
	lim := limits
	lim.MinGrant = d.minGrant
	return lim
}

// limits are the Driver's Limits known before any I/O.
var limits = backend.Limits{MinTTL: time.Second, MaxTTL: maxTTL, Resolution: time.Second}

// Guarantees: consensus-grade fencing (create revisions), FIFO, and a
// majority of the members must be up. Shared leases (semaphores, readers)
// are served with the same guarantees (see the package documentation).
func (d *Driver) Guarantees() backend.Guarantees {
	return backend.Guarantees{
		Backend:           "etcd",
		Fencing:           backend.FencingConsensus,
		ToleratedFailures: max(d.members-1, 0) / 2,
		FIFO:              true,
		Shared:            true,
		ClockDependent:    false,
		Notes: "Exclusion and tokens come from the Raft log: a later holder always has a larger token, " +
			"across leader changes. A holder paused past its lease may still believe it holds the lock " +
			"until Done fires; the protected resource must check tokens.",
	}
}

// As supports *(*clientv3.Client). From a *dlock.Locker:
// driver.LockerAs(locker, &client).
func (d *Driver) As(target any) bool {
	if p, ok := target.(**clientv3.Client); ok {
		*p = d.client
		return true
	}
	return false
}

// Close revokes the idle leases of the pool and, at the same time, makes
// one last attempt to revoke each lease whose revoke failed and was being
// retried in the background (a Release whose delete and revoke failed
// left it so: the released lock is then freed at Close if the cluster
// answers, not held for the rest of its TTL), all within 2s. It then stops
// the watches and the keepalive stream and, if the driver built the
// client itself from a URL, closes the client. A client passed to [New]
// stays open.
func (d *Driver) Close() error {
	var err error
	d.once.Do(func() {
		d.bg.Close()
		close(d.closing) // the background revokes make their last attempt
		end := time.AfterFunc(cleanupTimeout, d.revokeEnd)
		d.revokePool()
		d.cancel()
		d.eachHub(func(e *hubEntry) {
			if e.linger != nil {
				e.linger.Stop()
			}
		})
		d.bg.Wait()
		end.Stop()
		d.revokeEnd()
		if d.ownsClient {
			if cerr := d.client.Close(); cerr != nil {
				err = fmt.Errorf("%w: etcd: closing the client: %w", backend.ErrUnavailable, cerr)
			}
		}
	})
	return err
}

// ttlSeconds rounds ttl up to whole seconds, as etcd leases count.
func ttlSeconds(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

// waiter is one entry in a key's queue: our key under the key's directory,
// attached to a lease of our own, which the waiter owns (in use) until it
// puts it in the pool or revokes it.
type waiter struct {
	d     *Driver
	key   string // the lock name
	myKey string // dir + lease ID in hex (for a shared entry, dir + "s" + Permits + lease ID: see entryKey)
	// value is myKey's value: the acquire's holder description
	// (backend.Request.Holder; for a shared entry after its mark and
	// Permits, see entryValue), written with the key by the join and
	// again by every later write of ours to it (a move, a fence).
	value string
	// shared and permits are those of the request (backend.Request).
	shared  bool
	permits int
	// conflict is set by the grant rule when it finds the key's Permits
	// other than ours (see judge): the acquire leaves the queue and fails
	// with it.
	conflict *backend.PermitsError
	// othersAhead: the join of a shared entry found a shared entry of
	// another Permits ahead, and did not judge it (see joined).
	othersAhead bool
	// touch: a semaphore waiter granted after waiting, with an entry
	// behind it, writes its key once (see sharedView, touchKey).
	touch bool
	el    *etcdLease
	secs  int64 // asked, in seconds
	rev   int64 // create revision of myKey
	// modRev is the mod revision of our last write to myKey whose
	// outcome we know (the join's: rev; a move's; a fence's): every later
	// write of ours compares it (see lease.unchanged). Guarded by the
	// lease's leaseMu once the waiter is a lease.
	modRev int64
	// The lease lasts at least ttl (el.granted) from anchor, the sending
	// of the request that set its expiry (a grant or a keepalive; for a
	// pooled lease handed out without a keepalive, the last renewal, which
	// may be before the acquire began). The lease's expiry is never later
	// than anchor + ttl by our count.
	ttl    time.Duration
	anchor time.Time
	reg    *keyReg // the hub's interest in myKey
	// kaTTL is the TTL of the last keepalive answered while queued (0:
	// none), which counts from anchor; written by keepAlive, read after
	// it ended.
	kaTTL time.Duration

	renewed chan struct{} // while queued: a keepalive was answered (buffered, never closed)
}

// errGone: the key was deleted right after it was put (its lease ran out).
var errGone = errors.New("etcd: the lease ended as the key was put")

// enqueue puts our key in req.Key's queue, with req.Holder as its value, on
// a lease from the pool or a new one. It reports whether we are first in
// the queue (the holder).
func (d *Driver) enqueue(ctx context.Context, req backend.Request) (*waiter, bool, error) {
	secs := ttlSeconds(req.TTL)
	for {
		e, ok := d.pool.take(secs)
		if !ok {
			break
		}
		w, first, err := d.enqueuePooled(ctx, req, secs, e)
		if !errors.Is(err, errPoolStale) {
			return w, first, err
		}
	}
	return d.enqueueFresh(ctx, req, secs)
}

// errPoolStale: the pooled lease had run out; take another, or grant one.
var errPoolStale = errors.New("etcd: the pooled lease has run out")

// enqueueFresh grants a lease and puts our key on it.
func (d *Driver) enqueueFresh(ctx context.Context, req backend.Request, secs int64) (*waiter, bool, error) {
	w := newWaiter(d, req, secs)
	w.anchor = time.Now()
	g, err := call(ctx, d, "granting a lease", func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return d.client.Grant(ctx, w.secs)
	})
	if err != nil {
		return nil, false, err
	}
	w.el = newEtcdLease(g.ID, time.Duration(g.TTL)*time.Second)
	w.ttl = w.el.granted
	first, err := w.join(ctx)
	if err != nil {
		w.revoke(ctx)
		if errors.Is(err, errGone) {
			err = fmt.Errorf("%w: etcd: the new lease ended as the key was put", backend.ErrUnavailable)
		}
		return nil, false, err
	}
	return w, first, nil
}

// enqueuePooled puts our key on the idle lease e (which the caller took
// from the pool, so it is in use), and at the same time sends a keepalive
// of e: the grant's expiry counts from that keepalive's sending, and its
// TTL is the lease's granted TTL. A lease renewed within the last tenth of
// its granted TTL (poolFresh), by the lock it carried just before, gets no
// keepalive: the grant has its granted TTL from that renewal's sending (at
// least nine tenths of it is left). If e has run out (the put fails with
// "lease not found", or the keepalive finds it gone) it returns
// errPoolStale; nothing is left behind.
func (d *Driver) enqueuePooled(ctx context.Context, req backend.Request, secs int64, e pooled) (*waiter, bool, error) {
	w := newWaiter(d, req, secs)
	w.el = e.el
	now := time.Now()
	// Fresh: the lease lasts its granted TTL from the sending of its last
	// renewal (or grant), as e.expires counts.
	fresh := renewal{ttl: e.el.granted, sent: e.expires.Add(-e.el.granted)}
	wait := func() []renewal { return []renewal{fresh} }
	if e.expires.Sub(now) < e.el.granted-e.el.granted/poolFresh {
		wait = d.ka.start(ctx, []clientv3.LeaseID{e.el.id})
	}
	first, err := w.join(ctx)
	r := wait()[0]
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errGone):
		e.el.to(inUse, gone)
		return nil, false, errPoolStale
	case err != nil:
		// The put may have happened: revoking the lease deletes the
		// key.
		w.revoke(ctx)
		return nil, false, err
	case errors.Is(r.err, backend.ErrNotHeld):
		// The lease ran out after the put: the key went with it.
		w.reg.stop()
		e.el.to(inUse, gone)
		return nil, false, errPoolStale
	case r.err != nil:
		// The lease's expiry is not known: give it up.
		w.revoke(ctx)
		return nil, false, r.err
	}
	w.ttl, w.anchor = r.ttl, r.sent
	return w, first, nil
}

// newWaiter is the waiter of req, for a lease of secs seconds (w.el is
// not set yet).
func newWaiter(d *Driver, req backend.Request, secs int64) *waiter {
	return &waiter{d: d, key: req.Key, value: entryValue(req), shared: req.Shared, permits: req.Permits, secs: secs}
}

// join puts our key (on w.el, with w.value as its value: the holder
// description is stored atomically with the grant) in the queue and reads
// the queue's head (for a shared entry, what joinReads says), in one
// transaction; the hub's interest in our key is registered first, so that
// no delete of it is missed. It reports whether we are granted the lock
// (first in the queue; for a shared entry, see joined).
func (w *waiter) join(ctx context.Context) (bool, error) {
	d := w.d
	dir := d.dir(w.key)
	w.myKey = entryKey(dir, w.shared, w.permits, w.el.id)
	h, release := d.hubFor(dir, false)
	w.reg = h.watchKey(w.myKey, release)
	ops := append([]clientv3.Op{clientv3.OpPut(w.myKey, w.value, clientv3.WithLease(w.el.id))}, w.joinReads(dir)...)
	resp, err := call(ctx, d, "joining the queue", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return d.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(w.myKey), "=", 0)).
			Then(ops...).Commit()
	})
	if err != nil {
		w.reg.stop()
		return false, err
	}
	if !resp.Succeeded {
		// A free lease's key cannot exist: someone else writes under
		// our prefix.
		w.reg.stop()
		return false, fmt.Errorf("%w: etcd: key %q already exists; is another program writing under prefix %q?",
			backend.ErrUnavailable, w.myKey, d.prefix)
	}
	w.rev = resp.Header.Revision
	w.modRev = w.rev
	gone, unsure := w.reg.setRev(w.rev)
	if !gone && unsure {
		// The hub's watch was not in force throughout: read the key.
		g, err := d.get(ctx, "reading the lock key", w.myKey)
		if err != nil {
			w.reg.stop()
			return false, err
		}
		gone = len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != w.rev
	}
	if gone {
		w.reg.stop()
		return false, errGone
	}
	if w.shared {
		return w.joined(resp.Responses[1:]), nil
	}
	owner := resp.Responses[1].GetResponseRange().Kvs
	return len(owner) > 0 && owner[0].CreateRevision == w.rev, nil
}

// acquireErr is the error of an acquire that failed with err. When ctx
// ended it matches ErrNotAcquired and ctx.Err(); it also matches
// ErrUnavailable when the deadline passed while a request went unanswered
// (the cluster did not answer in time: no quorum, say), but not for a plain
// cancellation or a deadline reached while queued.
func acquireErr(ctx context.Context, err error) error {
	cerr := ctx.Err()
	switch {
	case cerr == nil || !errors.Is(err, cerr):
		return err
	case cerr == context.DeadlineExceeded && errors.Is(err, backend.ErrUnavailable):
		return fmt.Errorf("%w: %w", backend.ErrNotAcquired, err)
	}
	return fmt.Errorf("%w: %w", backend.ErrNotAcquired, cerr)
}

// TryAcquire makes one attempt: it joins the queue and, unless first (a
// shared request: unless granted, see the package documentation), leaves
// it at once (deleting its key; its lease goes back to the pool) and
// reports the key as held. A shared request whose join found a shared
// entry of another Permits ahead reads its queue once more, as a waiter
// does, and judges again: if the oldest shared entry ahead has other
// Permits, it leaves the queue and fails with a *backend.PermitsError.
func (d *Driver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	w, first, err := d.enqueue(ctx, req)
	if err != nil {
		return nil, acquireErr(ctx, err)
	}
	if !first && w.othersAhead {
		// The join did not judge: read the queue and judge once more.
		first, _, _, err = w.readQueue(ctx)
		if err == nil && first && w.touch {
			err = w.touchKey(ctx)
		}
		switch {
		case errors.Is(err, errMismatch):
			w.leave(ctx)
			return nil, w.conflict
		case err != nil:
			w.revoke(ctx)
			return nil, acquireErr(ctx, err)
		}
	}
	if !first {
		w.leave(ctx)
		return nil, &backend.HeldError{}
	}
	return d.newLease(w), nil
}

// Acquire joins key's queue and waits for every waiter ahead of it to go,
// waiting only for its immediate predecessor's delete (no herd effect),
// which the Driver's watch of the directory reports (see hub): the waiter's interest
// is registered before each queue read, so a delete after the read is never
// missed, and the watch is in etcd's synced group, so the waiter wakes
// within a round trip of the delete. (A shared waiter waits for the keys
// that sharedView says, which may be others.) The keys waited for are also
// read again after each answered keepalive, so a watch on a frozen member
// delays the waiter by about a third of its TTL, not for ever. While
// queued, the waiter's lease is kept alive; if it is lost anyway, or no
// keepalive was answered for its TTL (a partition, a cluster without
// quorum), Acquire fails with ErrUnavailable. A failed read (an election,
// say) is retried until then: it does not fail Acquire by itself. On any
// error or cancellation the lease is revoked, which removes the waiter
// key. A shared request whose grant rule finds the key's Permits other
// than its own (at its first read of the queue, or at a later one, see
// the package documentation) leaves the queue and fails with a
// *backend.PermitsError.
func (d *Driver) Acquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	w, first, err := d.enqueue(ctx, req)
	if err != nil {
		return nil, acquireErr(ctx, err)
	}
	if !first && w.othersAhead {
		// The join did not judge: read the queue and judge once more
		// before waiting (a read that fails is made again by the wait).
		if first, _, _, err = w.readQueue(ctx); errors.Is(err, errMismatch) {
			w.leave(ctx)
			return nil, w.conflict
		}
	}
	err = nil
	if !first {
		err = w.wait(ctx)
		if w.kaTTL > 0 {
			w.ttl = w.kaTTL // renewed while queued: from anchor
		}
		if errors.Is(err, errMismatch) {
			w.leave(ctx)
			return nil, w.conflict
		}
	}
	if err == nil && w.touch {
		err = w.touchKey(ctx)
	}
	if err != nil {
		w.revoke(ctx)
		return nil, acquireErr(ctx, err)
	}
	return d.newLease(w), nil
}

// errExpiredQueued: our key was gone when the waiter read its queue.
var errExpiredQueued = fmt.Errorf("%w: etcd: the waiter's lease expired while it was queued", backend.ErrUnavailable)

// wait returns once the waiter is granted the lock (for an exclusive
// waiter: no key older than ours is left in the queue; for a shared one,
// see judge) and our key is still there. A read that fails (an election,
// a member that does not answer) is tried again after a pause, as after a
// broken watch: the wait ends only when ctx does, or when the keepalive
// finds the lease lost or unanswered for its TTL, or (a shared waiter)
// with errMismatch when the grant rule finds the key's Permits other than
// ours.
func (w *waiter) wait(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w.renewed = make(chan struct{}, 1)
	var kaDone sync.WaitGroup
	kaDone.Go(func() { w.keepAlive(ctx, cancel) })
	defer kaDone.Wait() // after cancel (deferred later, run earlier)
	defer cancel(nil)
	reg := w.d.watchQueue(w.d.dir(w.key), wakeUpdates(w.shared, w.permits))
	defer reg.stop()

	// Each read takes, in one transaction, what decides our turn (for an
	// exclusive waiter, the key just ahead of ours) and our own key (which
	// must still be there: a waiter whose lease expired while queued is
	// never granted the lock): see readQueue.
	for {
		// Before the read: a change after it is then not missed.
		reg.reset()
		ok, ws, rev, err := w.readQueue(ctx)
		switch {
		case errors.Is(err, errExpiredQueued) || errors.Is(err, errMismatch):
			return err
		case err != nil:
			// Tried again until the keepalive gives up, or ctx ends.
			if err := pause(ctx, watchRetryPause); err != nil {
				return waitErr(ctx, err)
			}
			continue
		case ok:
			return nil // our turn
		}
		if w.d.afterQueueRead != nil {
			w.d.afterQueueRead()
		}
		if reg.expect(ws, rev) {
			continue // changed since the read
		}
		if err := w.waitWake(ctx, reg, ws); err != nil {
			return waitErr(ctx, err)
		}
	}
}

// waitWake waits until the queue should be read again: the hub saw a
// change of the keys ws that the waiter waits for, or its watch broke or
// was made again, or a read after an answered keepalive finds one of them
// changed (a watch on a frozen member delivers nothing).
func (w *waiter) waitWake(ctx context.Context, reg *dirReg, ws []watched) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-reg.ch:
			return nil
		case <-w.renewed:
			if changed, err := w.changed(ctx, ws); err == nil && changed {
				return nil
			}
		}
	}
}

// pause waits for d or until ctx ends, and then returns ctx's error.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitErr prefers the reason the wait's context was cancelled (the lease
// was lost) over the error it caused.
func waitErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return cause
	}
	return err
}

// changed reads the keys ws a waiter waits for (one Get for one key, its
// predecessor, as an exclusive waiter has) and reports whether one is gone,
// or written since the waiter's read where it waits for that.
func (w *waiter) changed(ctx context.Context, ws []watched) (bool, error) {
	if len(ws) == 1 {
		resp, err := queued(ctx, w, "reading the predecessor", func(ctx context.Context) (*clientv3.GetResponse, error) {
			return w.d.client.Get(ctx, ws[0].key)
		})
		if err != nil {
			return false, err
		}
		return ws[0].changedIn(resp.Kvs), nil
	}
	ops := make([]clientv3.Op, len(ws))
	for i, x := range ws {
		ops[i] = clientv3.OpGet(x.key)
	}
	resp, err := queued(ctx, w, "reading the keys ahead", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return w.d.client.Txn(ctx).Then(ops...).Commit()
	})
	if err != nil {
		return false, err
	}
	for i, x := range ws {
		if x.changedIn(resp.Responses[i].GetResponseRange().Kvs) {
			return true, nil
		}
	}
	return false, nil
}

// changedIn reports whether kvs, a read of w.key, shows it gone, or
// written since modRev where w waits for that.
func (w watched) changedIn(kvs []*mvccpb.KeyValue) bool {
	return len(kvs) == 0 || kvs[0].CreateRevision != w.createRev || w.updates && kvs[0].ModRevision > w.modRev
}

// queued makes a request of waiter w, as call does, bounded by
// [waiter.period] rather than by the request timeout alone: the client
// sends each request to the next member in turn, and one that went to a
// frozen member is better given up and sent again (to another member) than
// left to use up the lease's TTL or hold up the waiter.
func queued[T any](ctx context.Context, w *waiter, doing string, f func(context.Context) (T, error)) (T, error) {
	rctx, cancel := context.WithTimeout(ctx, w.period())
	defer cancel()
	v, err := call(rctx, w.d, doing, f)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return v, fmt.Errorf("%w: etcd: %s: no answer within %v", backend.ErrUnavailable, doing, w.period())
	}
	return v, err
}

// resent makes a read-only request, as call does, within the request
// timeout and ctx, and sends it again each time a fifth of the request
// timeout (at least a second) passes without an answer, keeping the
// earlier attempts: the first answer wins, so a read that is only slow
// still counts. An attempt that fails (a member killed, a leader change)
// is sent again at once if no other is out. The client sends each request
// to the next member in turn, and a read that went to a frozen member is
// better sent again, to another member, than left to use up a lease's TTL
// (a refresh's read answered in time by another member keeps the lease).
// Only for reads: a write whose answer is lost may still commit. It makes
// at most timeout/window + 2 attempts, and returns once they have ended.
func resent[T any](ctx context.Context, d *Driver, doing string, f func(context.Context) (T, error)) (T, error) {
	tctx, cancel := context.WithTimeout(ctx, d.timeout)
	var attempts sync.WaitGroup
	defer func() {
		cancel()
		attempts.Wait()
	}()
	window := max(d.timeout/5, time.Second)
	type result struct {
		v   T
		err error
	}
	results := make(chan result, int(d.timeout/window)+2)
	sent, out := 0, 0
	send := func() bool {
		if sent == cap(results) {
			return false
		}
		sent++
		out++
		attempts.Go(func() {
			v, err := call(tctx, d, doing, f)
			results <- result{v, err}
		})
		return true
	}
	send()
	tick := time.NewTicker(window)
	defer tick.Stop()
	var zero T
	var failed error
	for tctx.Err() == nil {
		select {
		case r := <-results:
			out--
			switch {
			case r.err == nil:
				return r.v, nil
			case tctx.Err() != nil:
			case out == 0 && !send():
				return zero, r.err
			default:
				failed = r.err
			}
		case <-tick.C:
			send()
		case <-tctx.Done():
		}
	}
	for drained := false; !drained; { // an answer that came with the deadline still counts
		select {
		case r := <-results:
			if r.err == nil {
				return r.v, nil
			}
		default:
			drained = true
		}
	}
	switch {
	case ctx.Err() != nil:
		return zero, unavailable(doing, ctx.Err())
	case failed != nil:
		return zero, failed
	}
	return zero, fmt.Errorf("%w: etcd: %s: no answer within the request timeout (%v)", backend.ErrUnavailable, doing, d.timeout)
}

// period bounds each request made while queued: a third of the TTL, at
// least a second, at most the request timeout.
func (w *waiter) period() time.Duration {
	return min(w.d.timeout, max(w.ttl/3, time.Second))
}

// keepAlive renews the waiter's lease every third of its TTL until ctx
// ends, recording when each successful renewal was sent. If the server
// says the lease is gone, or the TTL has passed since the last renewal the
// cluster answered (a partition, a cluster without quorum: the lease may
// have expired, and a grant made on it could not be trusted), it cancels
// the wait with that as the cause. A renewal not answered within
// [waiter.period] is given up and sent again soon (on a new keepalive
// stream, which may go to another member), so that one that went to a
// frozen member does not use up the TTL.
func (w *waiter) keepAlive(ctx context.Context, cancel context.CancelCauseFunc) {
	interval, ttl := w.ttl/3, w.ttl
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		expiry := w.anchor.Add(ttl) // the lease may have run out from here on
		if !time.Now().Before(expiry) {
			cancel(fmt.Errorf("%w: etcd: no keepalive of the waiter's lease was answered for its TTL (%v): it may have expired while queued",
				backend.ErrUnavailable, ttl))
			return
		}
		// Bound the renewal by the lease's possible expiry too.
		kdeadline := time.Now().Add(w.period())
		if expiry.Before(kdeadline) {
			kdeadline = expiry
		}
		kctx, kcancel := context.WithDeadline(ctx, kdeadline)
		r := w.d.ka.renewOne(kctx, w.el.id)
		kcancel()
		switch {
		case r.err == nil:
			// Read by wait's caller only after this goroutine ended.
			ttl, w.anchor, w.kaTTL = r.ttl, r.sent, r.ttl
			select {
			case w.renewed <- struct{}{}:
			default:
			}
			t.Reset(interval)
		case errors.Is(r.err, backend.ErrNotHeld):
			cancel(fmt.Errorf("%w: etcd: the waiter's lease expired while it was queued", backend.ErrUnavailable))
			return
		default:
			// A transient failure: try again soon, and at the latest
			// when the lease may have run out.
			t.Reset(max(0, min(interval/4, time.Until(expiry))))
		}
	}
}

// leave takes a waiter that was not first out of the queue: it deletes its
// key and puts its lease back in the pool, or, if the delete fails, revokes
// the lease (which deletes the key).
func (w *waiter) leave(ctx context.Context) {
	w.reg.stop()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	tr, err := w.d.txn(rctx, "leaving the queue",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(w.myKey), "=", w.rev)},
		clientv3.OpDelete(w.myKey))
	cancel()
	if err != nil || !tr.Succeeded {
		w.revoke(ctx)
		return
	}
	w.d.recycle(w.secs, w.el, w.anchor.Add(w.ttl))
}

// revoke gives the lease up, which deletes our key: see Driver.revoke.
func (w *waiter) revoke(ctx context.Context) {
	if w.reg != nil {
		w.reg.stop()
	}
	w.d.revoke(ctx, w.el)
}

// revoke revokes el (deleting any key on it): at once if the cluster
// answers within cleanupTimeout (even when ctx has ended), else in the
// background, until it is done or the lease has run out by itself (a dead
// waiter key would hold up the queue behind it until then), or Close has
// made one last attempt. From the start el is revoking, for good: it never
// goes back to the pool.
func (d *Driver) revoke(ctx context.Context, el *etcdLease) {
	el.startRevoke()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	err := d.revokeOnce(rctx, el)
	cancel()
	if err == nil {
		return
	}
	// A keepalive may have renewed it just now.
	until := time.Now().Add(max(el.granted, time.Second))
	d.bg.Go(func() {
		defer el.to(revoking, gone) // revoked, or run out by itself
		for time.Now().Before(until) {
			last := false
			select {
			case <-d.closing:
				last = true // Close: one last attempt, within its time
			case <-time.After(cleanupTimeout / 4):
			}
			rctx, cancel := context.WithTimeout(d.revokeCtx, cleanupTimeout)
			err := d.revokeOnce(rctx, el)
			cancel()
			if err == nil || last {
				return
			}
		}
	})
}

// call makes one request to the cluster: f with ctx bounded by the request
// timeout. Its error wraps ErrUnavailable and says what was being done. A
// request that ran out of time while ctx had not ended says so, and does
// not wrap context.DeadlineExceeded, which would suggest that ctx ended.
func call[T any](ctx context.Context, d *Driver, doing string, f func(context.Context) (T, error)) (T, error) {
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var v T
	var err error
	if fault := d.fault.Load(); fault != nil {
		err = (*fault)(doing, 0)
	}
	if err == nil {
		v, err = f(rctx)
	}
	switch {
	case err == nil:
		return v, nil
	case ctx.Err() == nil && rctx.Err() != nil:
		return v, fmt.Errorf("%w: etcd: %s: no answer within the request timeout (%v)", backend.ErrUnavailable, doing, d.timeout)
	}
	return v, unavailable(doing, err)
}

// get reads key within the request timeout.
func (d *Driver) get(ctx context.Context, doing, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return call(ctx, d, doing, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return d.client.Get(ctx, key, opts...)
	})
}

// unavailable wraps an etcd client error.
func unavailable(doing string, err error) error {
	return fmt.Errorf("%w: etcd: %s: %w", backend.ErrUnavailable, doing, err)
}
