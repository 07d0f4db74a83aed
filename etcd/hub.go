package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/dlock-go/dlock/backend"
)

// hub is one of a Driver's watches: on one lock's directory (a
// directory hub), or, for the directories beyond maxDirWatches, on the
// whole prefix (the prefix hub). It dispatches the deletes of keys in its
// range to the leases whose key they delete (a loss) and to the waiters
// whose predecessor they delete (a wake-up): no goroutine and no
// server-side watcher per lease or waiter. A hub with puts carries the
// puts of its directory as well: the semaphore waiters of a Driver that
// wait for a change of their predecessor (see wakeUpdates) share one per
// directory. Driver.hubFor hands the hubs out, and ends them.
//
// The watch starts without a revision, so that it is in etcd's synced group
// and a delete reaches it within a round trip. A registration made while
// the watch is in force sees every delete that commits after it; one made
// while the watch is (re-)starting or broken is covered when it is in force
// again: the held keys are read, and every waiter is woken to read its
// queue again.
type hub struct {
	d      *Driver
	prefix string          // the range watched: one lock's directory, or the Driver's prefix
	puts   bool            // puts too, not only deletes
	ctx    context.Context // ends the watch

	mu      sync.Mutex
	started bool
	live    bool   // the watch is in force: created, and not broken since
	gen     uint64 // bumped whenever the watch is created or breaks
	keys    map[string]*keyReg
	dirs    map[string]map[*dirReg]struct{}
	cancel  context.CancelFunc // of the current watch
}

// delEvent is one delete (or, on a directory hub, put) seen by the hub.
type delEvent struct {
	key string
	rev int64 // the change's revision
	put bool  // a put, not a delete
}

// keyReg is the hub's interest in one held (or queued) key.
type keyReg struct {
	h   *hub
	key string
	gen uint64 // h.gen at registration if the watch was live, else 0
	// Under h.mu:
	rev  int64       // the key's create revision; 0 until known
	seen []int64     // revisions of deletes of key seen while rev was 0
	lost bool        // a delete after rev was seen
	f    func(error) // the loss callback, once registered
	// release gives the hub back (see Driver.hubFor) when the interest
	// ends: at stop, or at the loss. Called once.
	release func()
}

// dirReg is a waiter's interest in the changes in one lock directory.
type dirReg struct {
	h       *hub
	dir     string
	ch      chan struct{} // receives when the waiter should read its queue again
	release func()        // gives the hub back (see Driver.hubFor) at stop
	// Under h.mu:
	watch []watched  // the keys whose change wakes the waiter; nil while unknown
	seen  []delEvent // changes in dir since reset, while watch is unknown
}

// watched is one key a waiter waits on: its delete wakes the waiter, and
// so does a write to it after modRev when updates is set.
type watched struct {
	key       string
	createRev int64
	modRev    int64
	updates   bool
}

// wakes reports whether a change of key at rev (a put, else a delete) is
// one that w waits for.
func (w watched) wakes(key string, rev int64, put bool) bool {
	return w.key == key && (!put || w.updates && rev > w.modRev)
}

// newHub is a hub on the range prefix (with puts if puts), whose watch
// ends with ctx.
func newHub(d *Driver, prefix string, puts bool, ctx context.Context) *hub {
	return &hub{d: d, prefix: prefix, puts: puts, ctx: ctx, keys: map[string]*keyReg{}, dirs: map[string]map[*dirReg]struct{}{}}
}

// startLocked starts the watch on first use. h.mu is held.
func (h *hub) startLocked() {
	if h.started {
		return
	}
	h.started = true
	h.d.bg.Go(func() { h.run(h.ctx) })
}

// lossErr is the error a lease's loss callback receives.
var lossErr = fmt.Errorf("%w: etcd: the lock key was deleted (lease expired or revoked)", backend.ErrLeaseLost)

// watchKey registers interest in deletes of key, before the transaction
// that puts it (its create revision is not known yet: see setRev); release
// gives the hub back when the interest ends.
func (h *hub) watchKey(key string, release func()) *keyReg {
	r := &keyReg{h: h, key: key, release: release}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.startLocked()
	if h.live {
		r.gen = h.gen
	}
	h.keys[key] = r
	return r
}

// setRev records the key's create revision. It reports whether a delete
// after it was seen already (the key is gone), and whether the watch may
// have missed one: it was not in force throughout since the registration,
// and the caller must read the key to know.
func (r *keyReg) setRev(rev int64) (gone, unsure bool) {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	r.rev = rev
	for _, dr := range r.seen {
		if dr > rev {
			r.lost = true
		}
	}
	r.seen = nil
	return r.lost, r.gen == 0 || r.gen != h.gen
}

// notify registers the loss callback: called at once if the loss is known.
func (r *keyReg) notify(f func(error)) {
	h := r.h
	h.mu.Lock()
	if !r.lost {
		r.f = f
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	f(lossErr)
}

// isLost reports whether a delete of the key was seen.
func (r *keyReg) isLost() bool {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.lost
}

// lostLocked marks r lost and ends its interest. It returns what to do
// once h.mu is released: call the loss callback, if any, and give the hub
// back (nil if r was lost or stopped already). h.mu is held.
func (r *keyReg) lostLocked() func() {
	if r.lost {
		return nil
	}
	r.lost = true
	f := r.f
	r.f = nil
	release := r.endLocked()
	if f == nil && release == nil {
		return nil
	}
	return func() {
		if f != nil {
			f(lossErr)
		}
		if release != nil {
			release()
		}
	}
}

// endLocked removes r from the hub and returns its release (nil if it
// was ended already). h.mu is held.
func (r *keyReg) endLocked() func() {
	if r.h.keys[r.key] == r {
		delete(r.h.keys, r.key)
	}
	release := r.release
	r.release = nil
	return release
}

// stop ends the interest: no callback is made after it returns.
func (r *keyReg) stop() {
	h := r.h
	h.mu.Lock()
	r.f = nil
	release := r.endLocked()
	h.mu.Unlock()
	if release != nil {
		release()
	}
}

// watchDir registers a waiter's interest in the deletes in dir.
func (h *hub) watchDir(dir string) *dirReg {
	r := &dirReg{h: h, dir: dir, ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.startLocked()
	m := h.dirs[dir]
	if m == nil {
		m = map[*dirReg]struct{}{}
		h.dirs[dir] = m
	}
	m[r] = struct{}{}
	return r
}

// reset forgets the keys watched and the changes seen; the waiter calls it
// just before it reads its queue.
func (r *dirReg) reset() {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.watch, r.seen = nil, nil
	select {
	case <-r.ch:
	default:
	}
}

// expect makes ws, found by a queue read at revision readRev, the keys
// whose change wakes the waiter (ws is not empty). It reports whether one
// of them changed after the read already.
func (r *dirReg) expect(ws []watched, readRev int64) (changed bool) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	for _, ev := range r.seen {
		if ev.rev > readRev && wakesAny(ws, ev) {
			return true
		}
	}
	r.watch, r.seen = ws, nil
	return false
}

// wakesAny reports whether ev is a change one of ws waits for.
func wakesAny(ws []watched, ev delEvent) bool {
	for _, w := range ws {
		if w.wakes(ev.key, ev.rev, ev.put) {
			return true
		}
	}
	return false
}

// stop ends the interest.
func (r *dirReg) stop() {
	h := r.h
	h.mu.Lock()
	if m := h.dirs[r.dir]; m != nil {
		delete(m, r)
		if len(m) == 0 {
			delete(h.dirs, r.dir)
		}
	}
	h.mu.Unlock()
	if r.release != nil {
		r.release()
	}
}

func (r *dirReg) wake() {
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// dispatch hands the deletes (and a directory hub's puts) of one watch
// response out.
func (h *hub) dispatch(evs []*clientv3.Event) {
	h.d.watchEvents.Add(int64(len(evs)))
	var calls []func()
	h.mu.Lock()
	for _, ev := range evs {
		put := ev.Type != clientv3.EventTypeDelete
		if put && !h.puts {
			continue
		}
		key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
		if r := h.keys[key]; r != nil && !put {
			switch {
			case r.rev == 0:
				r.seen = append(r.seen, rev)
			case rev > r.rev:
				if f := r.lostLocked(); f != nil {
					calls = append(calls, f)
				}
			}
		}
		i := strings.LastIndexByte(key, '/')
		if i < 0 {
			continue
		}
		for r := range h.dirs[key[:i+1]] {
			switch ev := (delEvent{key, rev, put}); {
			case r.watch == nil:
				r.seen = append(r.seen, ev)
			case wakesAny(r.watch, ev):
				r.wake()
			}
		}
	}
	h.mu.Unlock()
	for _, f := range calls {
		f()
	}
}

// wakeAllLocked wakes every waiter. h.mu is held.
func (h *hub) wakeAllLocked() {
	for _, m := range h.dirs {
		for r := range m {
			r.wake()
		}
	}
}

// run keeps the watch going until ctx ends. When the watch breaks
// (compacted, cancelled by a member without a leader, a client error) the
// waiters are woken, and the watch is made again (after watchBackoff);
// once it is created, the held keys are read (a delete between the break
// and the new watch would otherwise be missed) and the waiters woken again.
func (h *hub) run(ctx context.Context) {
	failures := 0 // watches since the last one created
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		h.mu.Lock()
		h.cancel = cancel
		h.mu.Unlock()
		if before := h.d.beforeWatch.Load(); before != nil {
			(*before)()
		}
		var werr error
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
		if !h.puts {
			opts = append(opts, clientv3.WithFilterPut())
		}
		wch := h.d.client.Watch(wctx, h.prefix, opts...)
		for wr := range wch {
			if err := wr.Err(); err != nil {
				werr = err
				break
			}
			if wr.Created {
				if err := h.established(wctx); err != nil {
					break
				}
				failures = 0
				continue
			}
			h.dispatch(wr.Events)
		}
		cancel()
		h.mu.Lock()
		h.live = false
		h.gen++
		h.wakeAllLocked()
		h.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		// Backing off only for a refusal: after a leader election or a
		// compaction the watch is made again at once.
		if refused(werr) {
			failures++
		} else {
			failures = 0
		}
		wait := watchBackoff(failures)
		// One warning when a watch breaks; while watches keep breaking
		// (a user without the right to read the prefix, a cluster
		// without a leader), one per watchWarnEvery and Driver, however
		// many directories it watches.
		if werr != nil && h.d.warnWatch() {
			what := "the lock prefix"
			if h.prefix != h.d.prefix {
				what = "a lock's directory"
			}
			h.d.log.Warn("dlock/etcd: the watch on "+what+" broke; waking the waiters and watching again",
				"prefix", h.prefix, "error", werr, "attempt", failures, "retry_in", wait)
		}
		_ = pause(ctx, wait)
	}
}

// watchWarnEvery spaces the warnings of a Driver's watches that keep
// failing.
const watchWarnEvery = 30 * time.Second

// warnWatch reports whether a broken watch should be logged now: if none
// was in the last watchWarnEvery.
func (d *Driver) warnWatch() bool {
	now := time.Now().UnixNano()
	last := d.watchWarned.Load()
	return (last == 0 || now-last >= int64(watchWarnEvery)) && d.watchWarned.CompareAndSwap(last, now)
}

// refused reports whether err, a watch's, is the cluster's refusal: the
// user lacks the right to read the prefix (it had it when checkAccess
// ran), or its authentication is no longer accepted.
func refused(err error) bool {
	if err == nil {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.PermissionDenied || ee.Code() == codes.Unauthenticated || errors.Is(err, rpctypes.ErrAuthFailed)
	}
	// The client closes a refused watch with an error made of the gRPC
	// status's text ("rpc error: code = PermissionDenied desc =
	// etcdserver: permission denied"), not the status itself.
	msg := err.Error()
	for _, e := range []error{rpctypes.ErrGRPCPermissionDenied, rpctypes.ErrGRPCInvalidAuthToken, rpctypes.ErrGRPCAuthFailed, rpctypes.ErrGRPCAuthOldRevision} {
		if strings.Contains(msg, rpctypes.ErrorDesc(e)) {
			return true
		}
	}
	return false
}

// watchBackoff is the pause before making a watch again after
// failures refusals in a row (refused): watchRetryPause for up to three,
// then doubling, up to 2s. A watch that breaks for another reason is made
// again after watchRetryPause; one the cluster refuses is not retried 20
// times a second.
func watchBackoff(failures int) time.Duration {
	const most = 2 * time.Second
	if failures <= 3 {
		return watchRetryPause
	}
	if failures > 10 {
		return most
	}
	return min(watchRetryPause<<(failures-3), most)
}

// established runs when the watch is created: it wakes the waiters, reads
// the held keys whose create revision is known (a key whose revision is not
// known yet is read by its acquire: see setRev), and then marks the watch
// live.
func (h *hub) established(ctx context.Context) error {
	h.mu.Lock()
	h.gen++
	h.wakeAllLocked()
	regs := make([]*keyReg, 0, len(h.keys))
	for _, r := range h.keys {
		if r.rev != 0 && !r.lost {
			regs = append(regs, r)
		}
	}
	h.mu.Unlock()
	if err := h.recheck(ctx, regs); err != nil {
		return err
	}
	h.mu.Lock()
	// Live only now: a key registered during the reads is read by its
	// acquire (setRev reports it unsure).
	h.live = true
	h.mu.Unlock()
	if c := h.d.watchCreated.Load(); c != nil {
		select {
		case *c <- struct{}{}:
		default:
		}
	}
	return nil
}

// recheckBatch is how many keys one transaction of recheck reads (etcd
// allows 128 operations per transaction by default).
const recheckBatch = 100

// recheck reads the keys of regs and reports those gone as lost.
func (h *hub) recheck(ctx context.Context, regs []*keyReg) error {
	for len(regs) > 0 {
		n := min(len(regs), recheckBatch)
		batch := regs[:n]
		regs = regs[n:]
		ops := make([]clientv3.Op, len(batch))
		for i, r := range batch {
			ops[i] = clientv3.OpGet(r.key, clientv3.WithKeysOnly())
		}
		resp, err := h.d.txn(ctx, "reading the held keys again", nil, ops...)
		if err != nil {
			return err
		}
		var calls []func()
		h.mu.Lock()
		for i, r := range batch {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != r.rev {
				if h.keys[r.key] == r {
					if f := r.lostLocked(); f != nil {
						calls = append(calls, f)
					}
				}
			}
		}
		h.mu.Unlock()
		for _, f := range calls {
			f()
		}
	}
	return nil
}

// breakWatch cancels the current watch (tests: as a compaction or a lost
// leader would).
func (h *hub) breakWatch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cancel != nil {
		h.cancel()
	}
}

// The watches a Driver keeps: one per lock directory in use (deletes only:
// the losses of its held keys and the wake-ups of its waiters), so that a
// release reaches the Drivers that use the lock, not every Driver under the
// prefix; one more per directory where semaphore waiters wait for a write
// (puts and deletes, see wakeUpdates); and, once maxDirWatches directory
// watches (of either kind) are in use, one watch on the whole prefix for
// the directories beyond (a watch with puts is made whatever the count).
// A deletes-only directory watch no longer in use lingers for
// watchLinger, in case the lock is taken again, unless its place is
// needed for another directory (any lingering one gives its place); a
// watch with puts ends with its last waiter.

// watchLinger (a time.Duration, 30s) is how long a directory watch no
// longer in use lingers, and maxDirWatches (64) the number of directory
// watches a Driver keeps before it watches the whole prefix too; NewDriver
// reads both. Tests shorten and lower them (the SetWatchLinger and
// SetMaxDirWatches hooks) so that few locks take every path quickly.
var (
	watchLinger   atomic.Int64
	maxDirWatches atomic.Int32
)

func init() {
	watchLinger.Store(int64(30 * time.Second))
	maxDirWatches.Store(64)
}

// hubKey names one of a Driver's hubs: its range and whether it has puts.
type hubKey struct {
	prefix string
	puts   bool
}

// hubEntry is a hub in use (refs registrations), or lingering.
type hubEntry struct {
	h      *hub
	refs   int
	cancel context.CancelFunc // ends the watch
	idle   time.Time          // when refs last fell to 0
	linger *time.Timer        // armed while refs is 0: ends the hub d.watchLinger after idle
}

// hubFor returns the hub that covers dir (with puts if puts), made if need
// be, and the function that gives it back (once) when the registration on
// it ends.
func (d *Driver) hubFor(dir string, puts bool) (*hub, func()) {
	d.hubsMu.Lock()
	defer d.hubsMu.Unlock()
	k := hubKey{dir, puts}
	e := d.hubs[k]
	if e == nil && d.dirWatchesLocked() >= d.maxDirWatches && !d.evictLocked() && !puts {
		k = hubKey{d.prefix, false}
		e = d.hubs[k]
	}
	if e == nil {
		ctx, cancel := context.WithCancel(d.ctx)
		e = &hubEntry{h: newHub(d, k.prefix, puts, ctx), cancel: cancel}
		d.hubs[k] = e
		d.hubsMade++
	}
	if e.linger != nil {
		e.linger.Stop()
	}
	e.refs++
	var once sync.Once
	return e.h, func() { once.Do(func() { d.unref(k, e) }) }
}

// unref gives a registration's hub back: with its last registration, a
// hub with puts ends at once, and another lingers.
func (d *Driver) unref(k hubKey, e *hubEntry) {
	d.hubsMu.Lock()
	defer d.hubsMu.Unlock()
	if e.refs--; e.refs > 0 {
		return
	}
	if k.puts {
		d.endLocked(k, e)
		return
	}
	e.idle = time.Now()
	if e.linger != nil {
		e.linger.Reset(d.watchLinger)
		return
	}
	e.linger = time.AfterFunc(d.watchLinger, func() {
		d.hubsMu.Lock()
		defer d.hubsMu.Unlock()
		if e.refs != 0 || d.hubs[k] != e {
			return
		}
		// A run of the timer armed before the last Reset, which
		// waited for the lock, must not end the hub early.
		if left := d.watchLinger - time.Since(e.idle); left > 0 {
			e.linger.Reset(left)
			return
		}
		d.endLocked(k, e)
	})
}

// dirWatchesLocked is the number of directory hubs: all of d.hubs but the
// prefix hub. d.hubsMu is held.
func (d *Driver) dirWatchesLocked() int {
	n := len(d.hubs)
	if _, ok := d.hubs[hubKey{d.prefix, false}]; ok {
		n--
	}
	return n
}

// evictLocked ends one lingering directory hub, if there is one, to make
// room for another. d.hubsMu is held.
func (d *Driver) evictLocked() bool {
	for k, e := range d.hubs {
		if e.refs == 0 && k.prefix != d.prefix {
			d.endLocked(k, e)
			return true
		}
	}
	return false
}

// endLocked ends the hub of e. d.hubsMu is held.
func (d *Driver) endLocked(k hubKey, e *hubEntry) {
	if e.linger != nil {
		e.linger.Stop()
	}
	delete(d.hubs, k)
	e.cancel()
}

// eachHub calls f on each of d's hubs (tests).
func (d *Driver) eachHub(f func(*hubEntry)) {
	d.hubsMu.Lock()
	defer d.hubsMu.Unlock()
	for _, e := range d.hubs {
		f(e)
	}
}
