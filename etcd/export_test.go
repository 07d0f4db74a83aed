package etcd

import (
	"net/url"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ParseURL exposes the URL parser to the tests (no base Options).
func ParseURL(u *url.URL) (*clientv3.Config, *Options, error) { return parseURL(u, Options{}) }

// WarnTransport is the warning of a URL's client that sends its password
// in clear text.
var WarnTransport = warnTransport
