package zookeeper

import "net/url"

// EncodeKey exposes the key encoding to the tests.
var EncodeKey = encodeKey

// ParseURL exposes the URL parser to the tests (no base Options).
func ParseURL(u *url.URL) ([]string, *Options, error) { return parseURL(u, Options{}) }

// Seq and Before expose the queue order to the tests.
var (
	Seq    = seq
	Before = before
)

// Judge exposes the grant rule to the tests: the turn of node me (of the
// kind of a request with shared and permits) in the listing kids; gone
// reports that the nodes waited for are watched through the Driver's
// shared deletion watches (a permit waiter's), not one data watch.
func Judge(kids []string, me string, shared bool, permits int) (granted bool, wait []string, gone bool, mismatch error) {
	t := judge(kids, me, kind{shared: shared, permits: permits})
	if t.mismatch != nil {
		mismatch = t.mismatch
	}
	return t.granted, t.wait, t.how == watchGone, mismatch
}

// NodeTag exposes the part of a lock node's name that names its kind.
func NodeTag(shared bool, permits int) string { return kind{shared: shared, permits: permits}.tag() }

// Holders exposes the number of holders at the head of the queue kids.
func Holders(kids []string) int { return holders(entries(kids)) }
