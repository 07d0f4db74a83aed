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
