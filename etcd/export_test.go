package etcd

import (
	"context"
	"log/slog"
	"net/url"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// OwnClient makes d close its client on Close, as a driver opened from a URL
// does; the tests give every Locker its own client, as separate processes
// would have.
func OwnClient(d *Driver) { d.ownsClient = true }

// Dir is the etcd key prefix of key's queue.
func Dir(d *Driver, key string) string { return d.dir(key) }

// ParseURL exposes the URL parser to the tests (no base Options).
func ParseURL(u *url.URL) (*clientv3.Config, *Options, error) { return parseURL(u, Options{}) }

// AfterQueueRead makes d call f each time a waiter has read its queue and
// found a predecessor, before it starts watching it.
func AfterQueueRead(d *Driver, f func()) { d.afterQueueRead = f }

// AfterMove makes d pass the outcome of each move transaction of Refresh
// (to a new lease) through f, which may replace it: an error in place of a
// success is an answer lost after the move committed.
func AfterMove(d *Driver, f func(error) error) { d.afterMove = f }

// BreakWatch cancels d's prefix watch, as a compaction or a lost leader
// would; d makes it again.
func BreakWatch(d *Driver) { d.hub.breakWatch() }

// WatchCreated returns a channel that receives each time d's prefix watch
// has been created and the held keys read again.
func WatchCreated(d *Driver) <-chan struct{} {
	d.hub.mu.Lock()
	defer d.hub.mu.Unlock()
	if d.hub.created == nil {
		d.hub.created = make(chan struct{}, 16)
	}
	return d.hub.created
}

// PoolSize is the number of idle leases in d's pool.
func PoolSize(d *Driver) int { return d.pool.size() }

// BeforeWatch makes d's prefix watch call f before each time it is made.
func BeforeWatch(d *Driver, f func()) {
	d.hub.mu.Lock()
	defer d.hub.mu.Unlock()
	d.hub.before = f
}

// LoggerOf returns the Logger d logs to.
func LoggerOf(d *Driver) *slog.Logger { return d.log }

// InjectFault makes d ask f before each request it sends: doing names the
// request as its errors do ("deleting the lock key", "reading the lock key
// after a move", ...; "revoking a lease" for each revoke, with the lease's
// ID, else id is 0). An error f returns fails the request unsent, as if the
// cluster had not answered. Nil removes f.
func InjectFault(d *Driver, f func(doing string, id clientv3.LeaseID) error) {
	if f == nil {
		d.fault.Store(nil)
		return
	}
	d.fault.Store(&f)
}

// HoldMove makes d call f before it sends each move transaction of Refresh
// (to the new lease to). commit sends exactly that transaction, and reports
// whether it succeeded. If f returns an error, the move is not sent and
// fails with it: a move whose answer was lost while the transaction was
// still in the Raft log, which the test may commit later, at any point.
func HoldMove(d *Driver, f func(to clientv3.LeaseID, commit func(context.Context) (bool, error)) error) {
	d.holdMove = f
}

// WarnTransport is the warning of a URL's client that sends its password
// in clear text.
var WarnTransport = warnTransport
