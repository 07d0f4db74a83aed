package zookeeper

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	m := driver.DefaultURLMux()
	m.RegisterLocker("zk", &URLOpener{})
	m.RegisterLocker("zks", &URLOpener{})
}

// URLOpener opens zk:// and zks:// (TLS) URLs:
//
//	zk://[user:password@]host1:2181,host2:2181[/prefix]?session_timeout=30s&ttl=15s
//	zks://alice:secret@host1:2281/locks?ca=ca.pem&acl=digest:alice:<digest>:cdrwa,digest:bob:<digest>:cdrwa
//
// The path is the prefix znode (default /dlock). user:password turns on
// digest authentication (Options.Auth). Parameters: ttl (every backend),
// session_timeout (default 40s), tick_time (the servers' tickTime, default
// 2s; see Options.TickTime), dial_timeout (default 5s; the bound on the
// wait for a session), acl (Options.ACL: entries scheme:id:perms separated
// by commas, as zkCli writes them, such as world:anyone:r or
// digest:bob:<base64 of SHA-1 of bob:password>:cdrwa; write a '+' of a
// digest as %2B; ids holding a comma, such as x509 names, are for
// Options.ACL only); for zks (TLS, the servers' secureClientPort): ca (a
// PEM file of the CAs to trust, default the system's), cert and key (PEM
// files of a client certificate and its key; both or neither),
// server_name (the name to verify, default each server's host as
// written, not the address it resolves to). The
// package registers a zero URLOpener on
// driver.DefaultURLMux; register one of your own on a driver.URLMux to open
// URLs with your own Logger or Options (Options.Dialer opens the
// connections to the servers the URL names). There is no client to pass:
// the backend owns its ZooKeeper session (see [New]).
type URLOpener struct {
	// Options configure the backend and (Options.Locker) the Lockers it
	// opens, Logger included. The URL's path, credentials and parameters
	// override the fields they name (ttl overrides Options.Locker.TTL).
	Options Options
}

// OpenLockerURL opens a Locker for u. Errors wrap
// [backend.ErrInvalidConfig] (before any I/O) or [backend.ErrUnavailable].
func (o *URLOpener) OpenLockerURL(ctx context.Context, u *url.URL) (*dlock.Locker, error) {
	return driver.OpenURL(u, o.Options.Locker, limits, func(rest *url.URL, lo *dlock.Options) (func() (backend.Driver, error), error) {
		base := o.Options
		base.Locker = lo
		return func() (backend.Driver, error) { return open(ctx, rest, base) }, nil
	})
}

// Guarantees declares, before any I/O, what every Locker the opener opens
// promises at best (driver.GuaranteesDeclarer).
func (o *URLOpener) Guarantees() dlock.Guarantees {
	return dlock.Guarantees{Fencing: dlock.FencingConsensus, Shared: true}
}

// open connects to the servers of u. dial_timeout bounds the wait for the
// first session (and the prefix node's creation); on failure the client is
// closed (no reconnect loop or warnings left) and the error carries the
// last dial error.
func open(ctx context.Context, u *url.URL, base Options) (backend.Driver, error) {
	servers, opts, dialTimeout, err := parseURLTimeout(u, base)
	if err != nil {
		return nil, err
	}
	var (
		dials urlparam.DialRecorder
		mu    sync.Mutex
		quiet []*quietConn // connections dialled during Open
		over  bool         // Open is over: stop tracking
	)
	// The hooks see the dials after any TLS handshake: its failure (a
	// CA that did not issue the certificate) is the dial error reported,
	// and only bytes after it count as an answer.
	hooks := &dialHooks{note: dials.Note, conn: func(c net.Conn) net.Conn {
		qc := &quietConn{Conn: c}
		mu.Lock()
		if !over {
			quiet = append(quiet, qc)
		}
		mu.Unlock()
		return qc
	}}
	dctx, cancel := urlparam.WithDialTimeout(ctx, dialTimeout)
	defer cancel()
	// When dctx ends, close the connections of this Open that never got
	// a byte (a server that accepts but does not answer): go-zookeeper
	// would otherwise wait for its connect response, and its Close for
	// the loop, up to two seconds past the deadline.
	context.AfterFunc(dctx, func() {
		mu.Lock()
		defer mu.Unlock()
		over = true
		for _, c := range quiet {
			if !c.heard.Load() {
				_ = c.Close()
			}
		}
		quiet = nil
	})
	d, err := newDriver(dctx, servers, opts, hooks)
	if err != nil {
		return nil, dials.Explain(dctx, err, dialTimeout)
	}
	return d, nil
}

// quietConn records whether anything was read from the connection.
type quietConn struct {
	net.Conn
	heard atomic.Bool
}

func (c *quietConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heard.Store(true)
	}
	return n, err
}

// parseURL turns u into the server list and options (base, with the fields
// the URL names set from it), without I/O.
func parseURL(u *url.URL, base Options) ([]string, *Options, error) {
	servers, o, _, err := parseURLTimeout(u, base)
	return servers, o, err
}

// parseURLTimeout is parseURL that also returns dial_timeout.
func parseURLTimeout(u *url.URL, base Options) ([]string, *Options, time.Duration, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: zookeeper: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "zk" && u.Scheme != "zks" {
		return nil, nil, 0, bad("scheme %q: want zk or zks", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, 0, bad("no servers in %s (want zk://host:2181,host2:2181/prefix)", u.Redacted())
	}
	servers, err := urlparam.Hosts(u.Host, "2181", "server")
	if err != nil {
		return nil, nil, 0, urlparam.In("zookeeper", err)
	}
	o := base
	if p := strings.TrimRight(u.Path, "/"); p != "" {
		if err := checkPrefix(p); err != nil {
			return nil, nil, 0, err
		}
		o.Prefix = p
	}
	if u.User != nil {
		pw, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, nil, 0, bad("digest authentication needs user:password in the URL")
		}
		o.Auth = u.User.Username() + ":" + pw
	}
	q, err := urlparam.Query(u)
	if err != nil {
		return nil, nil, 0, urlparam.In("zookeeper", err)
	}
	dialTimeout, err := urlparam.DialTimeout(q)
	if err != nil {
		return nil, nil, 0, urlparam.In("zookeeper", err)
	}
	if v, ok, err := urlparam.Take(q, "session_timeout"); err != nil {
		return nil, nil, 0, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t < minSessionTimeout || t > maxSessionTimeout {
			return nil, nil, 0, bad("parameter session_timeout=%q: want a duration from %v to %v, such as 30s", v, minSessionTimeout, maxSessionTimeout)
		}
		o.SessionTimeout = t
	}
	if v, ok, err := urlparam.Take(q, "tick_time"); err != nil {
		return nil, nil, 0, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t < minTickTime || t > maxTickTime {
			return nil, nil, 0, bad("parameter tick_time=%q: want the servers' tickTime, a duration from %v to %v, such as 2s", v, minTickTime, maxTickTime)
		}
		o.TickTime = t
	}
	if v, ok, err := urlparam.Take(q, "acl"); err != nil {
		return nil, nil, 0, err
	} else if ok {
		if o.ACL, err = parseACL(v); err != nil {
			return nil, nil, 0, err
		}
		if err := checkACL(o.ACL, o.Auth); err != nil {
			return nil, nil, 0, err
		}
	}
	var tlsParams [4]string
	for i, name := range []string{"ca", "cert", "key", "server_name"} {
		v, ok, err := urlparam.Take(q, name)
		if err != nil {
			return nil, nil, 0, err
		}
		if ok && u.Scheme != "zks" {
			return nil, nil, 0, bad("parameter %s needs the zks scheme (TLS)", name)
		}
		tlsParams[i] = v
	}
	if err := urlparam.NoneLeft(q, "ttl", "session_timeout", "tick_time", "dial_timeout", "acl", "ca", "cert", "key", "server_name"); err != nil {
		return nil, nil, 0, urlparam.In("zookeeper", err)
	}
	if u.Scheme == "zks" {
		if o.TLS, err = urlparam.TLSConfig("zookeeper", tlsParams[0], tlsParams[1], tlsParams[2], tlsParams[3]); err != nil {
			return nil, nil, 0, err
		}
	}
	return servers, &o, dialTimeout, nil
}
