package zookeeper

// EncodeKey exposes the key encoding to the tests.
var EncodeKey = encodeKey

// ParseURL exposes the URL parser to the tests.
var ParseURL = parseURL

// Seq and Before expose the queue order to the tests.
var (
	Seq    = seq
	Before = before
)

// CutOffMargin exposes how much longer than its session timeout a waiter
// without a connection waits.
const CutOffMargin = cutOffMargin
