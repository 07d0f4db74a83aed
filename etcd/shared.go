package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// Shared leases (semaphore permits and readers, backend.Request.Shared):
// see "Shared leases" in the package documentation for the layout, the
// grant rule and how waiters wait.

// sharedMark is the first byte of a shared entry's value: a holder
// description is printable UTF-8 (backend.ValidateHolder), so no
// exclusive entry's value begins with it.
const sharedMark = '\x01'

// entryKey is the etcd key of an entry of ours on lease id in the lock
// directory dir: dir + the lease ID in 16 hex digits for an exclusive
// entry (as it always was); for a shared one, dir + "s" + its Permits in 16
// hex digits + the lease ID. The exclusive entries are thus the range
// [dir, dir+"g"), the shared ones the range [dir+"s", dir+"t"), and those
// of one Permits the prefix permitsPrefix: a read of a few keys, or a
// count, tells whether an entry of either kind, or a shared entry of
// another Permits, is in the queue, without reading the queue.
func entryKey(dir string, shared bool, permits int, id clientv3.LeaseID) string {
	if shared {
		return fmt.Sprintf("%s%016x", permitsPrefix(dir, permits), int64(id))
	}
	return fmt.Sprintf("%s%016x", dir, int64(id))
}

// permitsPrefix is the prefix of the shared entries of Permits p in dir.
func permitsPrefix(dir string, p int) string { return fmt.Sprintf("%ss%016x", dir, uint64(p)) }

// exclusiveEnd and sharedRange bound the entries of each kind in dir.
func exclusiveEnd(dir string) string            { return dir + "g" }
func sharedRange(dir string) (from, end string) { return dir + "s", dir + "t" }

// keyRange is the range [from, end) of etcd keys.
type keyRange struct{ from, end string }

// otherPermits are the two ranges of dir's shared entries whose Permits
// are not p: those below p's prefix and those above it.
func otherPermits(dir string, p int) [2]keyRange {
	from, end := sharedRange(dir)
	own := permitsPrefix(dir, p)
	return [2]keyRange{{from, own}, {clientv3.GetPrefixRangeEnd(own), end}}
}

// isSharedKey reports whether key, an entry in dir, is a shared one.
func isSharedKey(dir, key string) bool {
	return len(key) > len(dir) && key[len(dir)] == 's'
}

// keyPermits reads the Permits in the name of key, a shared entry in dir;
// false if the name is not one of ours.
func keyPermits(dir, key string) (int, bool) {
	s, ok := strings.CutPrefix(key, dir+"s")
	if !ok || len(s) != 32 {
		return 0, false
	}
	p, err := strconv.ParseUint(s[:16], 16, strconv.IntSize-1)
	if err != nil {
		return 0, false
	}
	return int(p), true
}

// entryValue is the value of req's entry: the holder description for an
// exclusive request (unchanged from before shared leases); for a shared
// one, sharedMark, the Permits in decimal, ":" and the holder description.
func entryValue(req backend.Request) string {
	if !req.Shared {
		return req.Holder
	}
	return string(sharedMark) + strconv.Itoa(req.Permits) + ":" + req.Holder
}

// parseValue reads an entry's value: its Permits (-1 for a shared value
// that is not one of ours) and holder description. An exclusive value is
// the holder description.
func parseValue(v []byte) (permits int, holder string) {
	if len(v) == 0 || v[0] != sharedMark {
		return 0, string(v)
	}
	n, h, ok := strings.Cut(string(v[1:]), ":")
	p, err := strconv.Atoi(n)
	if !ok || err != nil || p < 0 {
		return -1, ""
	}
	return p, h
}

// wakeUpdates reports whether a waiter of this kind may wait for a write
// to its predecessor, not only for deletes: a semaphore's waiter (Permits
// > 0) behind another waiter waits until that one is granted or leaves,
// and a waiter that is granted after waiting writes its key once (touch)
// to say so. Such waiters watch their lock's directory with puts (one
// watch per directory and Driver: see watchQueue); the others rely on the
// Driver's watch of the directory for its held keys, which carries deletes
// only.
func wakeUpdates(shared bool, permits int) bool { return shared && permits > 0 }

// sharedView is what a shared entry's reads tell of the entries ahead of
// it (older: a smaller create revision), which its grant rule judges.
type sharedView struct {
	exclusive bool  // an exclusive entry is ahead
	others    bool  // a shared entry with another Permits is ahead
	ahead     int64 // the entries ahead (a read may stop at Permits+1)
	// oldest is the Permits of the oldest shared entry ahead (-1 if its
	// name is not one of ours, or none is left), when oldestRead.
	oldest     int
	oldestRead bool
}

// verdict is the grant rule's answer on a shared entry.
type verdict int

const (
	waiting    verdict = iota // not granted: wait, and judge again
	granted                   // the entry holds
	mismatch                  // another Permits holds (w.conflict): fail, deleting the entry
	needOldest                // read the oldest shared entry ahead, and judge again
)

// judge is the grant rule of a shared entry, on what its reads found of
// the entries ahead (A), the one rule of the join (TryAcquire's and
// Acquire's first judgement) and of every read of a waiter (see "Shared
// leases" in the package documentation):
//
//   - a shared entry of another Permits in A: if the oldest shared entry
//     of A has another Permits, a mismatch (w.conflict is set); else wait.
//     An entry of another Permits that is not the oldest is one that
//     fails with a PermitsError of its own (it judged the oldest as we
//     do) and is about to leave: it is neither evidence of the key's
//     Permits nor compatible with us;
//   - else an exclusive entry in A: wait;
//   - else granted if Permits is 0 (a reader) or A has fewer than Permits
//     entries; else wait.
//
// Every entry ahead of a granted entry has its Permits, so no two granted
// entries ever differ in Permits, and a semaphore's granted entries are
// never more than its Permits.
func (w *waiter) judge(v sharedView) verdict {
	switch {
	case v.others && !v.oldestRead:
		return needOldest
	case v.others && v.oldest >= 0 && v.oldest != w.permits:
		w.conflict = &backend.PermitsError{Asked: w.permits, Held: v.oldest}
		return mismatch
	case v.others || v.exclusive:
		return waiting
	case w.permits == 0 || v.ahead < int64(w.permits):
		return granted
	}
	return waiting
}

// errMismatch: the grant rule found the key's Permits other than ours
// (w.conflict says which); the acquire deletes its entry and fails with
// w.conflict.
var errMismatch = errors.New("etcd: another Permits holds the key")

// joinReads are the reads of a join's transaction, after its put, of a
// waiter in dir: the queue's head for an exclusive entry; for a shared
// one, an exclusive entry if any, the number of entries, and a shared
// entry of another Permits, if any, in each of the two ranges of other
// Permits. Every other entry is older than ours then: all are ahead of it.
// None of these sorts the queue: a transaction with a put runs in etcd's
// apply loop, one at a time, and a read sorted by create revision reads
// the whole range.
func (w *waiter) joinReads(dir string) []clientv3.Op {
	if !w.shared {
		return []clientv3.Op{clientv3.OpGet(dir, clientv3.WithFirstCreate()...)}
	}
	others := otherPermits(dir, w.permits)
	return []clientv3.Op{
		clientv3.OpGet(dir, clientv3.WithRange(exclusiveEnd(dir)), clientv3.WithLimit(1)),
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(others[0].from, clientv3.WithRange(others[0].end), clientv3.WithLimit(1)),
		clientv3.OpGet(others[1].from, clientv3.WithRange(others[1].end), clientv3.WithLimit(1)),
	}
}

// joined judges a shared entry on the answers rs to joinReads, and reports
// whether it is granted. If a shared entry of another Permits is ahead, it
// is not, and w.othersAhead is set: the join has not read the oldest
// shared entry ahead, which decides between a mismatch and a wait (see
// judge), and the acquire reads its queue once more.
func (w *waiter) joined(rs []*pb.ResponseOp) bool {
	v := sharedView{
		exclusive: len(rs[0].GetResponseRange().Kvs) > 0,
		ahead:     rs[1].GetResponseRange().Count - 1,
		others:    len(rs[2].GetResponseRange().Kvs)+len(rs[3].GetResponseRange().Kvs) > 0,
	}
	w.othersAhead = v.others
	return w.judge(v) == granted
}

// queueReads are the reads of a waiter's queue, each in a transaction with
// the waiter's own key as the second (index 1):
//
//   - exclusive: the entry just ahead of ours;
//   - a reader (Permits 0): the nearest exclusive entry ahead of ours, and
//     the nearest shared entry ahead with another Permits in each range of
//     other Permits;
//   - a semaphore's waiter (Permits n > 0): up to n+1 entries just ahead of
//     ours (the nearest first), the nearest exclusive entry ahead, the
//     number of entries, and the nearest shared entries of other Permits
//     ahead, as for a reader.
//
// The ranges of other Permits are empty unless requests disagree on the
// Permits, so their sorted reads cost next to nothing.
func (w *waiter) queueReads() []clientv3.Op {
	dir := w.d.dir(w.key)
	own := clientv3.OpGet(w.myKey)
	nearest := func(from, end string) clientv3.Op {
		return clientv3.OpGet(from, clientv3.WithRange(end),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithLimit(1))
	}
	if !w.shared {
		return []clientv3.Op{clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(w.rev-1))...), own}
	}
	nearestExclusive := nearest(dir, exclusiveEnd(dir))
	others := otherPermits(dir, w.permits)
	if w.permits == 0 {
		return []clientv3.Op{nearestExclusive, own, nearest(others[0].from, others[0].end), nearest(others[1].from, others[1].end)}
	}
	return []clientv3.Op{
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithLimit(int64(w.permits)+1)),
		own,
		nearestExclusive,
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		nearest(others[0].from, others[0].end),
		nearest(others[1].from, others[1].end),
	}
}

// readQueue reads the waiter's queue (queueReads, in one transaction) and
// judges it: it reports whether the waiter is granted the lock, else the
// keys whose change it waits for (see wakeFor and sharedView) and the
// revision of the read. Our own key must still be there (else
// errExpiredQueued: a waiter whose lease expired while queued is never
// granted the lock). A shared waiter whose read finds a shared entry of
// another Permits ahead reads the oldest shared entry ahead as well, in a
// second read, and judges again (errMismatch if it has another Permits).
// A semaphore's waiter granted with an entry behind it sets w.touch.
func (w *waiter) readQueue(ctx context.Context) (bool, []watched, int64, error) {
	resp, err := queued(ctx, w, "reading the queue", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return w.d.client.Txn(ctx).Then(w.queueReads()...).Commit()
	})
	if err != nil {
		return false, nil, 0, err
	}
	rs, rev := resp.Responses, resp.Header.Revision
	if kvs := rs[1].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != w.rev {
		return false, nil, 0, errExpiredQueued
	}
	if !w.shared {
		ws := w.wakeFor(rs)
		return ws == nil, ws, rev, nil
	}
	v, ws := w.sharedView(rs)
	verdict := w.judge(v)
	if verdict == needOldest {
		dir := w.d.dir(w.key)
		from, end := sharedRange(dir)
		o, err := queued(ctx, w, "reading the oldest shared entry ahead", func(ctx context.Context) (*clientv3.GetResponse, error) {
			return w.d.client.Get(ctx, from, clientv3.WithRange(end),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithLimit(1))
		})
		if err != nil {
			return false, nil, 0, err
		}
		v.oldest, v.oldestRead = -1, true
		if len(o.Kvs) > 0 {
			if p, ok := keyPermits(dir, string(o.Kvs[0].Key)); ok {
				v.oldest = p
			}
		}
		verdict = w.judge(v)
	}
	switch {
	case verdict == mismatch:
		return false, nil, 0, errMismatch
	case verdict == granted:
		return true, nil, rev, nil
	case len(ws) == 0:
		// Not granted, and nothing ahead to wait for: a read that
		// does not add up (keys not of ours in the queue). Read again.
		return false, nil, 0, fmt.Errorf("%w: etcd: the queue of %q holds keys that are not dlock's", backend.ErrUnavailable, w.key)
	}
	return false, ws, rev, nil
}

// wakeFor reads the answers rs to an exclusive waiter's queueReads: it
// returns nil when the waiter is granted the lock (no entry is ahead),
// else the entry just ahead, whose delete it waits for.
func (w *waiter) wakeFor(rs []*pb.ResponseOp) []watched {
	kvs := rs[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil
	}
	return []watched{{key: string(kvs[0].Key), createRev: kvs[0].CreateRevision}}
}

// sharedView reads the answers rs to a shared waiter's queueReads: what
// they tell of the entries ahead (for judge), and the keys whose change the
// waiter waits for if it is not granted:
//
//   - a reader with an exclusive entry X ahead: the delete of X (the
//     nearest). The readers behind a writer are woken together by its
//     delete, and granted together: that is no herd;
//   - a reader with shared entries of another Permits ahead (leaving with
//     a PermitsError): their deletes;
//   - a semaphore's waiter with an exclusive entry X ahead and fewer than
//     Permits entries between X and itself: the delete of X;
//   - a semaphore's waiter that read every entry ahead (at most Permits of
//     them, no exclusive one: all holders, or shared entries of another
//     Permits about to leave, or waiters about to be granted): the delete
//     of any of them;
//   - any other semaphore waiter: its predecessor, a waiter too, for a
//     delete or a write. It can be granted, or become the first waiter,
//     only once its predecessor is granted (or gone), and a waiter that is
//     granted after waiting writes its key once (touch) when an entry is
//     behind it. A release thus wakes the first waiter, and its grant the
//     next one: O(1) requests per grant, however many wait.
//
// It sets w.touch for a semaphore's waiter with an entry behind it (used
// if it is granted).
func (w *waiter) sharedView(rs []*pb.ResponseOp) (sharedView, []watched) {
	deleteOf := func(kvs ...*mvccpb.KeyValue) []watched {
		ws := make([]watched, len(kvs))
		for i, kv := range kvs {
			ws[i] = watched{key: string(kv.Key), createRev: kv.CreateRevision}
		}
		return ws
	}
	if w.permits == 0 {
		x := rs[0].GetResponseRange().Kvs
		others := append(slices.Clone(rs[2].GetResponseRange().Kvs), rs[3].GetResponseRange().Kvs...)
		v := sharedView{exclusive: len(x) > 0, others: len(others) > 0}
		if v.exclusive {
			return v, deleteOf(x...)
		}
		return v, deleteOf(others...)
	}
	n := w.permits
	ahead := rs[0].GetResponseRange().Kvs // nearest first, at most n+1
	x := rs[2].GetResponseRange().Kvs
	v := sharedView{
		exclusive: len(x) > 0,
		others:    len(rs[4].GetResponseRange().Kvs)+len(rs[5].GetResponseRange().Kvs) > 0,
		ahead:     int64(len(ahead)),
	}
	// Any other entry than ours and those ahead is behind.
	w.touch = rs[3].GetResponseRange().Count > int64(len(ahead))+1
	switch {
	case len(x) > 0:
		for _, kv := range ahead[:min(n, len(ahead))] {
			if kv.CreateRevision == x[0].CreateRevision {
				return v, deleteOf(kv)
			}
		}
	case len(ahead) <= n:
		return v, deleteOf(ahead...)
	}
	// The predecessor (x ahead of it, or more than n entries ahead).
	p := ahead[0]
	return v, []watched{{key: string(p.Key), createRev: p.CreateRevision, modRev: p.ModRevision, updates: true}}
}

// touchKey writes our key once, unchanged (same value, same lease), in a
// transaction that requires it to be ours and unwritten since our last
// write (see lease.unchanged): the put wakes the waiter right behind us,
// which waits for our grant (see wakeFor). Its revision is our last write
// from then on. If the key is gone, the grant fails as a waiter whose
// lease expired while queued does; if the outcome is not known, it fails
// too (ErrUnavailable), and the caller revokes the lease: a write that may
// still commit would leave the key's mod revision unknown.
func (w *waiter) touchKey(ctx context.Context) error {
	tr, err := w.d.txn(ctx, "telling the next waiter of the grant",
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(w.myKey), "=", w.rev),
			clientv3.Compare(clientv3.LeaseValue(w.myKey), "=", w.el.id),
			clientv3.Compare(clientv3.ModRevision(w.myKey), "=", w.modRev),
		},
		clientv3.OpPut(w.myKey, w.value, clientv3.WithLease(w.el.id)))
	switch {
	case err != nil:
		return err
	case !tr.Succeeded:
		return errExpiredQueued
	}
	w.modRev = tr.Header.Revision
	return nil
}

// watchQueue registers a waiter's interest in the changes in its lock's
// directory dir: on the directory's hub, with puts when the waiter may
// wait for a write (updates, see wakeUpdates).
func (d *Driver) watchQueue(dir string, updates bool) *dirReg {
	h, release := d.hubFor(dir, updates)
	r := h.watchDir(dir)
	r.release = release
	return r
}

// holders returns the entries of dir's queue that hold the lock, oldest
// first, read at revision rev, given its head (the oldest entry), which
// holds it: the head alone if exclusive; else the shared entries with the
// head's Permits ahead of the first exclusive entry and of the first
// shared entry of another Permits (one that fails with a PermitsError: it
// is not granted, and no entry behind it is while it is there), at most
// Permits of them for a semaphore.
func (d *Driver) holders(ctx context.Context, dir string, head *mvccpb.KeyValue, rev int64) ([]*mvccpb.KeyValue, error) {
	if !isSharedKey(dir, string(head.Key)) {
		return []*mvccpb.KeyValue{head}, nil
	}
	permits, _ := parseValue(head.Value)
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if permits > 0 {
		opts = append(opts, clientv3.WithLimit(int64(permits)))
	} else {
		x, err := d.get(ctx, "reading the queue's first writer", dir, clientv3.WithRange(exclusiveEnd(dir)), clientv3.WithRev(rev),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil {
			return nil, err
		}
		if len(x.Kvs) > 0 {
			opts = append(opts, clientv3.WithMaxCreateRev(x.Kvs[0].CreateRevision-1))
		}
	}
	resp, err := d.get(ctx, "reading the holders", dir, opts...)
	if err != nil {
		return nil, err
	}
	var hs []*mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		if !isSharedKey(dir, string(kv.Key)) {
			break
		}
		if p, _ := parseValue(kv.Value); p != permits {
			break
		}
		hs = append(hs, kv)
	}
	return hs, nil
}
