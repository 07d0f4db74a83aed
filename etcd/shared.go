package etcd

import (
	"context"
	"fmt"
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
// entry (as it always was), dir + "s" + the lease ID for a shared one. The
// exclusive entries are thus the range [dir, dir+"g"), the shared ones the
// range [dir+"s", dir+"t"): a waiter finds the nearest exclusive entry
// ahead of it, or the oldest shared one, in one read of a few keys.
func entryKey(dir string, shared bool, id clientv3.LeaseID) string {
	if shared {
		return fmt.Sprintf("%ss%016x", dir, int64(id))
	}
	return fmt.Sprintf("%s%016x", dir, int64(id))
}

// exclusiveEnd and sharedRange bound the entries of each kind in dir.
func exclusiveEnd(dir string) string            { return dir + "g" }
func sharedRange(dir string) (from, end string) { return dir + "s", dir + "t" }

// isSharedKey reports whether key, an entry in dir, is a shared one.
func isSharedKey(dir, key string) bool {
	return len(key) > len(dir) && key[len(dir)] == 's'
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
// Driver's prefix watch, which carries deletes only.
func wakeUpdates(shared bool, permits int) bool { return shared && permits > 0 }

// joinReads are the reads of a join's transaction, after its put, of a
// waiter in dir: the queue's head for an exclusive entry; for a shared one,
// two shared entries (one not ours, whose Permits ours must have), one
// exclusive entry if any, and the number of entries. Every other entry is
// older than ours then: all are ahead of it. None of these sorts the
// queue: a transaction with a put runs in etcd's apply loop, one at a
// time, and a read sorted by create revision reads the whole range.
func (w *waiter) joinReads(dir string) []clientv3.Op {
	if !w.shared {
		return []clientv3.Op{clientv3.OpGet(dir, clientv3.WithFirstCreate()...)}
	}
	from, end := sharedRange(dir)
	return []clientv3.Op{
		clientv3.OpGet(from, clientv3.WithRange(end), clientv3.WithLimit(2)),
		clientv3.OpGet(dir, clientv3.WithRange(exclusiveEnd(dir)), clientv3.WithLimit(1)),
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithCountOnly()),
	}
}

// joined reads the answers rs to joinReads of a shared entry: it sets
// w.conflict if a shared entry ahead (one not ours) asks for another
// Permits, and reports whether we are granted: no exclusive entry ahead
// and, for a semaphore, fewer than Permits entries ahead. Every shared
// entry that stays in the queue has the Permits of the shared entries
// ahead of it when it joined, so any one of them tells the key's Permits;
// one that is about to leave with a PermitsError of its own is a waiter
// ahead with another Permits too.
func (w *waiter) joined(rs []*pb.ResponseOp) bool {
	for _, kv := range rs[0].GetResponseRange().Kvs {
		if kv.CreateRevision == w.rev {
			continue // ours
		}
		if p, _ := parseValue(kv.Value); p != w.permits && p >= 0 {
			w.conflict = &backend.PermitsError{Asked: w.permits, Held: p}
			return false
		}
		break
	}
	if len(rs[1].GetResponseRange().Kvs) > 0 {
		return false // a writer is ahead
	}
	ahead := rs[2].GetResponseRange().Count - 1
	return w.permits == 0 || ahead < int64(w.permits)
}

// queueReads are the reads of a waiter's queue, each in a transaction with
// the waiter's own key as the second (index 1):
//
//   - exclusive: the entry just ahead of ours;
//   - a reader (Permits 0): the nearest exclusive entry ahead of ours;
//   - a semaphore's waiter (Permits n > 0): up to n+1 entries just ahead of
//     ours (the nearest first), the nearest exclusive entry ahead, and the
//     number of entries.
func (w *waiter) queueReads() []clientv3.Op {
	dir := w.d.dir(w.key)
	own := clientv3.OpGet(w.myKey)
	nearestExclusive := clientv3.OpGet(dir, clientv3.WithRange(exclusiveEnd(dir)),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithLimit(1))
	switch {
	case !w.shared:
		return []clientv3.Op{clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(w.rev-1))...), own}
	case w.permits == 0:
		return []clientv3.Op{nearestExclusive, own}
	}
	return []clientv3.Op{
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithLimit(int64(w.permits)+1)),
		own,
		nearestExclusive,
		clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithCountOnly()),
	}
}

// wakeFor reads the answers rs to queueReads: it returns nil when the
// waiter is granted the lock, else the keys whose change it waits for:
//
//   - an exclusive waiter: the delete of the entry just ahead (the lock is
//     its when no entry is ahead);
//   - a shared waiter with an exclusive entry X ahead and fewer than
//     Permits entries between X and itself (any number, for a reader): the
//     delete of X. The readers behind a writer are woken together by its
//     delete, and granted together: that is no herd;
//   - a semaphore's waiter with no exclusive entry ahead and exactly
//     Permits entries ahead (all holders: the first waiter): the delete of
//     any of them;
//   - any other semaphore waiter: its predecessor, a waiter too, for a
//     delete or a write. It can be granted, or become the first waiter,
//     only once its predecessor is granted (or gone), and a waiter that is
//     granted after waiting writes its key once (touch) when an entry is
//     behind it. A release thus wakes the first waiter, and its grant the
//     next one: O(1) requests per grant, however many wait.
//
// A semaphore's waiter granted with an entry behind it sets w.touch.
func (w *waiter) wakeFor(rs []*pb.ResponseOp) []watched {
	if !w.shared {
		kvs := rs[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil
		}
		return []watched{{key: string(kvs[0].Key), createRev: kvs[0].CreateRevision}}
	}
	if w.permits == 0 {
		x := rs[0].GetResponseRange().Kvs
		if len(x) == 0 {
			return nil
		}
		return []watched{{key: string(x[0].Key), createRev: x[0].CreateRevision}}
	}
	n := w.permits
	ahead := rs[0].GetResponseRange().Kvs // nearest first, at most n+1
	x := rs[2].GetResponseRange().Kvs
	switch {
	case len(x) > 0:
		for _, kv := range ahead[:min(n, len(ahead))] {
			if kv.CreateRevision == x[0].CreateRevision {
				return []watched{{key: string(kv.Key), createRev: kv.CreateRevision}}
			}
		}
	case len(ahead) < n:
		// All the entries ahead are in ahead: any other but ours is
		// behind.
		w.touch = rs[3].GetResponseRange().Count > int64(len(ahead))+1
		return nil
	case len(ahead) == n:
		ws := make([]watched, len(ahead))
		for i, kv := range ahead {
			ws[i] = watched{key: string(kv.Key), createRev: kv.CreateRevision}
		}
		return ws
	}
	// The predecessor (x ahead of it, so ahead is not empty).
	p := ahead[0]
	return []watched{{key: string(p.Key), createRev: p.CreateRevision, modRev: p.ModRevision, updates: true}}
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

// dirHub is a directory hub and the number of registrations on it.
type dirHub struct {
	h      *hub
	refs   int
	cancel context.CancelFunc
}

// watchQueue registers a waiter's interest in the changes in its lock's
// directory dir: on the Driver's prefix hub (deletes only), or, when the
// waiter may wait for a write (updates, see wakeUpdates), on the
// directory hub of dir (puts and deletes), made with its first
// registration and ended with its last.
func (d *Driver) watchQueue(dir string, updates bool) *dirReg {
	if !updates {
		return d.hub.watchDir(dir)
	}
	d.dirHubsMu.Lock()
	dh := d.dirHubs[dir]
	if dh == nil {
		ctx, cancel := context.WithCancel(d.ctx)
		dh = &dirHub{h: newDirHub(d, dir, ctx), cancel: cancel}
		d.dirHubs[dir] = dh
	}
	dh.refs++
	d.dirHubsMu.Unlock()
	r := dh.h.watchDir(dir)
	r.release = func() {
		d.dirHubsMu.Lock()
		defer d.dirHubsMu.Unlock()
		if dh.refs--; dh.refs == 0 {
			delete(d.dirHubs, dir)
			dh.cancel()
		}
	}
	return r
}

// holders returns the entries of dir's queue that hold the lock, oldest
// first, read at revision rev, given its head (the oldest entry), which
// holds it: the head alone if exclusive; else the shared entries ahead of
// the first exclusive one with the head's Permits, at most Permits of them
// for a semaphore (an entry with other Permits is one that fails with a
// PermitsError: it is not granted, but counts as ahead).
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
		if p, _ := parseValue(kv.Value); p == permits {
			hs = append(hs, kv)
		}
	}
	return hs, nil
}
