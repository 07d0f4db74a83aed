package redlock

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	m := driver.DefaultURLMux()
	m.RegisterLocker("redlock", &URLOpener{})
	m.RegisterLocker("redlocks", &URLOpener{})
}

// URLOpener opens redlock:// and redlocks:// (TLS to every node) URLs:
//
//	redlock://[[user]:password@]h1:6379,h2:6379,h3:6379[/db]?ttl=10s&prefix=dlock:&drift_factor=0.01&node_timeout=50ms
//
// The credentials, database and TLS parameters apply to every node (see
// the package documentation). The package registers
// a zero URLOpener on driver.DefaultURLMux; register one of your own on a
// driver.URLMux to open URLs with your own clients, Logger or Options.
type URLOpener struct {
	// Clients, if set, are the nodes every URL opens on (they stay the
	// caller's: closing the Locker leaves them open); the URL's hosts,
	// credentials and database are then not used. Default nil: one client
	// per host of the URL, closed with the Locker.
	Clients []goredis.UniversalClient
	// Options configure the backend and (Options.Locker) the Lockers it
	// opens, Logger included. The URL's parameters override the fields
	// they name (ttl overrides Options.Locker.TTL).
	Options Options
}

// OpenLockerURL opens a Locker for u. Errors wrap
// [backend.ErrInvalidConfig] (before any I/O) or [backend.ErrUnavailable].
func (o *URLOpener) OpenLockerURL(ctx context.Context, u *url.URL) (*dlock.Locker, error) {
	return driver.OpenURL(u, o.Options.Locker, limits, func(rest *url.URL, lo *dlock.Options) (func() (backend.Driver, error), error) {
		base := o.Options
		base.Locker = lo
		if o.Clients != nil {
			_, opts, err := parseURL(rest, base)
			if err != nil {
				return nil, err
			}
			return func() (backend.Driver, error) { return NewDriver(ctx, o.Clients, opts) }, nil
		}
		return func() (backend.Driver, error) { return open(ctx, rest, base) }, nil
	})
}

// Guarantees declares, before any I/O, what every Locker the opener opens
// promises at best (driver.GuaranteesDeclarer).
func (o *URLOpener) Guarantees() dlock.Guarantees {
	return dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "Redlock: see the redlock package"}
}

// open makes one client per node of u, which the driver owns.
func open(ctx context.Context, u *url.URL, base Options) (backend.Driver, error) {
	nodes, opts, err := parseURL(u, base)
	if err != nil {
		return nil, err
	}
	clients := make([]goredis.UniversalClient, len(nodes))
	dials := make([]urlparam.DialRecorder, len(nodes))
	for i, o := range nodes {
		c := goredis.NewClient(o)
		c.AddHook(dialHook{&dials[i]})
		clients[i] = c
	}
	// dial_timeout bounds the whole Open: NewDriver's name lookups and its
	// wait for the script loads (up to 4 × node_timeout) as well as the
	// pings.
	dialTimeout := nodes[0].DialTimeout
	dctx, cancel := urlparam.WithDialTimeout(ctx, dialTimeout)
	defer cancel()
	d, err := NewDriver(dctx, clients, opts)
	if err != nil {
		for _, c := range clients {
			_ = c.Close()
		}
		return nil, err
	}
	d.ownsClients = true
	warnTransport(d.log, nodes)
	if err := reachQuorum(dctx, d, dials, dialTimeout); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// reachQuorum pings every node in parallel, within dctx (bounded by
// dialTimeout with urlparam.WithDialTimeout), and returns nil as soon as a
// majority has answered, or an error wrapping backend.ErrUnavailable with
// each failed node's error (and its last dial error) once a majority can no
// longer answer.
func reachQuorum(dctx context.Context, d *Driver, dials []urlparam.DialRecorder, dialTimeout time.Duration) error {
	pctx, cancel := context.WithCancel(dctx)
	type reply struct {
		i   int
		err error
	}
	replies := make(chan reply, len(d.nodes))
	var wg sync.WaitGroup
	for i, c := range d.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Ping(pctx).Err()
			replies <- reply{i, dials[i].Explain(pctx, err, dialTimeout)}
		}()
	}
	defer func() {
		cancel() // ends the pings still out
		wg.Wait()
	}()
	ok, failed := 0, make([]string, 0, len(d.nodes))
	for range d.nodes {
		r := <-replies
		if r.err == nil {
			if ok++; ok >= d.quorum {
				return nil
			}
			continue
		}
		failed = append(failed, fmt.Sprintf("node %d (%s): %v", r.i, nodeAddr(d.nodes[r.i]), r.err))
		if len(failed) > len(d.nodes)-d.quorum {
			break
		}
	}
	slices.Sort(failed)
	return fmt.Errorf("%w: redlock: %d of %d nodes answered, a majority (%d) is needed: %s",
		backend.ErrUnavailable, ok, len(d.nodes), d.quorum, strings.Join(failed, "; "))
}

func nodeAddr(c goredis.UniversalClient) string {
	if c, ok := c.(*goredis.Client); ok {
		return c.Options().Addr
	}
	return "?"
}

// dialHook records a client's failed dials (TLS handshakes included).
type dialHook struct{ dials *urlparam.DialRecorder }

func (h dialHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		h.dials.Note(err)
		return c, err
	}
}

func (dialHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// warnTransport logs, on log, one warning for nodes whose connections
// anyone on the network path can read: TLS without certificate checks
// (skip_verify=true), or a password sent in clear text to nodes not on
// loopback.
func warnTransport(log *slog.Logger, nodes []*goredis.Options) {
	var remote []string
	for _, o := range nodes {
		if o.TLSConfig != nil && o.TLSConfig.InsecureSkipVerify {
			log.Warn("dlock/redlock: "+urlparam.SkipVerifyWarning, "nodes", len(nodes))
			return
		}
		if o.TLSConfig == nil && o.Password != "" && !urlparam.Loopback(o.Addr) {
			remote = append(remote, o.Addr)
		}
	}
	if len(remote) > 0 {
		log.Warn("dlock/redlock: "+urlparam.PlaintextPasswordWarning, "nodes", strings.Join(remote, ","))
	}
}

// parseURL turns u into one client configuration per node and the options
// (base, with the fields the URL names set from it), without I/O.
func parseURL(u *url.URL, base Options) ([]*goredis.Options, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: redlock: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "redlock" && u.Scheme != "redlocks" {
		return nil, nil, bad("scheme %q: want redlock or redlocks", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, bad("no nodes in %s (want redlock://h1:6379,h2:6379,h3:6379)", u.Redacted())
	}
	addrs, err := urlparam.Hosts(u.Host, "6379", "node")
	if err != nil {
		return nil, nil, urlparam.In("redlock", err)
	}
	db := 0
	if p := strings.Trim(u.Path, "/"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || strings.Trim(p, "0123456789") != "" {
			return nil, nil, bad("database %q: want a number ≥ 0", p)
		}
		db = n
	}
	q, err := urlparam.Query(u)
	if err != nil {
		return nil, nil, urlparam.In("redlock", err)
	}
	dialTimeout, err := urlparam.DialTimeout(q)
	if err != nil {
		return nil, nil, urlparam.In("redlock", err)
	}
	o := base
	if v, ok, err := urlparam.Take(q, "prefix"); err != nil {
		return nil, nil, err
	} else if ok {
		o.Prefix = v
	}
	if v, ok, err := urlparam.Take(q, "drift_factor"); err != nil {
		return nil, nil, err
	} else if ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f < 0.5) { // NaN too
			return nil, nil, bad("parameter drift_factor=%q: want a number above 0 and below 0.5", v)
		}
		o.DriftFactor = f
	}
	if v, ok, err := urlparam.Take(q, "node_timeout"); err != nil {
		return nil, nil, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 {
			return nil, nil, bad("parameter node_timeout=%q: want a positive duration such as 50ms", v)
		}
		o.NodeTimeout = t
	}
	// TLS, for redlocks only: the parameters of rediss:// in the redis
	// backend.
	var tlsParams [5]string
	for i, name := range []string{"ca", "cert", "key", "server_name", "skip_verify"} {
		v, ok, err := urlparam.Take(q, name)
		if err != nil {
			return nil, nil, urlparam.In("redlock", err)
		}
		if ok && u.Scheme != "redlocks" {
			return nil, nil, bad("parameter %s needs the redlocks scheme (TLS)", name)
		}
		tlsParams[i] = v
	}
	var skipVerify bool
	switch tlsParams[4] {
	case "", "false", "0":
	case "true", "1":
		skipVerify = true
	default:
		return nil, nil, bad("parameter skip_verify=%q: want true or false", tlsParams[4])
	}
	known := []string{"ttl", "prefix", "drift_factor", "node_timeout", "dial_timeout"}
	if u.Scheme == "redlocks" {
		known = append(known, "ca", "cert", "key", "server_name", "skip_verify")
	}
	if err := urlparam.NoneLeft(q, known...); err != nil {
		return nil, nil, urlparam.In("redlock", err)
	}
	var tc *tls.Config
	if u.Scheme == "redlocks" {
		if tc, err = urlparam.TLSConfig("redlock", tlsParams[0], tlsParams[1], tlsParams[2], tlsParams[3]); err != nil {
			return nil, nil, err
		}
		tc.InsecureSkipVerify = skipVerify
	}
	var nodes []*goredis.Options
	for _, h := range addrs {
		// A node listed twice, under any spelling, is refused by
		// NewDriver (checkServers).
		co := &goredis.Options{Addr: h, DB: db, ContextTimeoutEnabled: true, DialTimeout: dialTimeout}
		if u.User != nil {
			co.Username = u.User.Username()
			co.Password, _ = u.User.Password()
		}
		if tc != nil {
			co.TLSConfig = tc.Clone()
			if co.TLSConfig.ServerName == "" {
				co.TLSConfig.ServerName, _, _ = net.SplitHostPort(h) // the host dialled
			}
		}
		nodes = append(nodes, co)
	}
	return nodes, &o, nil
}
