package etcd

// OwnClient makes d close its client on Close, as a driver opened from a URL
// does; the tests give every Locker its own client, as separate processes
// would have.
func OwnClient(d *Driver) { d.ownsClient = true }

// Dir is the etcd key prefix of key's queue.
func Dir(d *Driver, key string) string { return d.dir(key) }

// ParseURL exposes the URL parser to the tests.
var ParseURL = parseURL

// AfterQueueRead makes d call f each time a waiter has read its queue and
// found a predecessor, before it starts watching it.
func AfterQueueRead(d *Driver, f func()) { d.afterQueueRead = f }

// AfterMove makes d pass the outcome of each move transaction of Refresh
// (to a new lease) through f, which may replace it: an error in place of a
// success is an answer lost after the move committed.
func AfterMove(d *Driver, f func(error) error) { d.afterMove = f }
