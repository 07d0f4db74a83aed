package etcd

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/internal/testhook"
)

// The hooks below exist for the backend's tests against real servers in
// the development module (tests/etcd), which cannot reach the package's
// internals; they fetch them with testhook.Get under these names. A hook
// does nothing unless a test calls it.
func init() {
	// OwnClient makes d close its client on Close, as a driver opened from
	// a URL does; the tests give every Locker its own client, as separate
	// processes would have.
	testhook.Set("etcd.OwnClient", func(d *Driver) { d.ownsClient = true })

	// AfterQueueRead makes d call f each time a waiter has read its queue
	// and found a predecessor, before it starts watching it.
	testhook.Set("etcd.AfterQueueRead", func(d *Driver, f func()) { d.afterQueueRead = f })

	// AfterMove makes d pass the outcome of each move transaction of
	// Refresh (to a new lease) through f, which may replace it: an error in
	// place of a success is an answer lost after the move committed.
	testhook.Set("etcd.AfterMove", func(d *Driver, f func(error) error) { d.afterMove = f })

	// BreakWatch cancels each of d's watches, as a compaction or a lost
	// leader would; d makes them again.
	testhook.Set("etcd.BreakWatch", func(d *Driver) {
		d.eachHub(func(e *hubEntry) { e.h.breakWatch() })
	})

	// WatchCreated returns a channel that receives each time one of d's
	// watches has been created and its held keys read again.
	testhook.Set("etcd.WatchCreated", func(d *Driver) <-chan struct{} {
		c := make(chan struct{}, 16)
		if !d.watchCreated.CompareAndSwap(nil, &c) {
			return *d.watchCreated.Load()
		}
		return c
	})

	// PoolSize is the number of idle leases in d's pool.
	testhook.Set("etcd.PoolSize", func(d *Driver) int { return d.pool.size() })

	// BeforeWatch makes each of d's watches call f before each time it
	// is made; nil removes f.
	testhook.Set("etcd.BeforeWatch", func(d *Driver, f func()) {
		if f == nil {
			d.beforeWatch.Store(nil)
			return
		}
		d.beforeWatch.Store(&f)
	})

	// DirWatches is the number of d's watches in use: those that a held
	// key or a waiter is registered on (a watch that lingers after its
	// last use is not counted).
	testhook.Set("etcd.DirWatches", func(d *Driver) int {
		n := 0
		d.eachHub(func(e *hubEntry) {
			if e.refs > 0 {
				n++
			}
		})
		return n
	})

	// MaxDirWatches is how many directory watches a Driver keeps before
	// it watches the whole prefix for the directories beyond.
	testhook.Set("etcd.MaxDirWatches", func() int { return int(maxDirWatches.Load()) })

	// SetMaxDirWatches sets that number for the Drivers opened from then
	// on (at least 1), and returns the number it replaces.
	testhook.Set("etcd.SetMaxDirWatches", func(n int) int { return int(maxDirWatches.Swap(int32(max(n, 1)))) })

	// SetWatchLinger sets how long a directory watch no longer in use
	// lingers, for the Drivers opened from then on, and returns the
	// duration it replaces.
	testhook.Set("etcd.SetWatchLinger", func(d time.Duration) time.Duration { return time.Duration(watchLinger.Swap(int64(d))) })

	// WatchesMade is the number of watches d has made: one per
	// directory (or prefix) it began to watch, not counting those made
	// again after a break.
	testhook.Set("etcd.WatchesMade", func(d *Driver) int {
		d.hubsMu.Lock()
		defer d.hubsMu.Unlock()
		return d.hubsMade
	})

	// WatchEvents is the number of events d's watches have received.
	testhook.Set("etcd.WatchEvents", func(d *Driver) int64 { return d.watchEvents.Load() })

	// LoggerOf returns the Logger d logs to.
	testhook.Set("etcd.LoggerOf", func(d *Driver) *slog.Logger { return d.log })

	// InjectFault makes d ask f before each request it sends: doing names
	// the request as its errors do ("deleting the lock key", "reading the
	// lock key after a move", ...; "revoking a lease" for each revoke, with
	// the lease's ID, else id is 0). An error f returns fails the request
	// unsent, as if the cluster had not answered. Nil removes f.
	testhook.Set("etcd.InjectFault", func(d *Driver, f func(doing string, id clientv3.LeaseID) error) {
		if f == nil {
			d.fault.Store(nil)
			return
		}
		d.fault.Store(&f)
	})

	// HoldMove makes d call f before it sends each move transaction of
	// Refresh (to the new lease to). commit sends exactly that transaction,
	// and reports whether it succeeded. If f returns an error, the move is
	// not sent and fails with it: a move whose answer was lost while the
	// transaction was still in the Raft log, which the test may commit
	// later, at any point.
	testhook.Set("etcd.HoldMove", func(d *Driver, f func(to clientv3.LeaseID, commit func(context.Context) (bool, error)) error) {
		d.holdMove = f
	})
}
