package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	m := driver.DefaultURLMux()
	m.RegisterLocker("etcd", &URLOpener{})
	m.RegisterLocker("etcds", &URLOpener{})
}

// URLOpener opens etcd:// and etcds:// URLs (see [open] below for their
// form and parameters). The package registers a zero URLOpener on
// driver.DefaultURLMux; register one of your own on a driver.URLMux to open
// URLs with your own client, Logger or Options.
type URLOpener struct {
	// Client, if set, is the client every URL opens on (it stays the
	// caller's: closing the Locker leaves it open); the URL's endpoints,
	// credentials and client parameters (dial_timeout, TLS) are then not
	// used. Default nil: a client is made from the URL, and closed with
	// the Locker.
	Client *clientv3.Client
	// Options configure the backend and (Options.Locker) the Lockers it
	// opens, Logger included. The URL's path and parameters override the
	// fields they name (ttl overrides Options.Locker.TTL).
	Options Options
}

// OpenLockerURL opens a Locker for u. Errors wrap
// [backend.ErrInvalidConfig] (before any I/O) or [backend.ErrUnavailable].
func (o *URLOpener) OpenLockerURL(ctx context.Context, u *url.URL) (*dlock.Locker, error) {
	return driver.OpenURL(u, o.Options.Locker, limits, func(rest *url.URL, lo *dlock.Options) (func() (backend.Driver, error), error) {
		base := o.Options
		base.Locker = lo
		if o.Client != nil {
			_, opts, err := parseURL(rest, base)
			if err != nil {
				return nil, err
			}
			return func() (backend.Driver, error) { return NewDriver(ctx, o.Client, opts) }, nil
		}
		return func() (backend.Driver, error) { return open(ctx, rest, base) }, nil
	})
}

// Guarantees declares, before any I/O, what every Locker the opener opens
// promises at best (driver.GuaranteesDeclarer).
func (o *URLOpener) Guarantees() dlock.Guarantees {
	return dlock.Guarantees{Fencing: dlock.FencingConsensus, Shared: true}
}

// defaultDialTimeout bounds the first round trip of a client built from a
// URL (dial_timeout).
const defaultDialTimeout = urlparam.DefaultDialTimeout

// A client built from a URL pings each member it has a stream to after
// dialKeepAliveTime without traffic (gRPC's least allowed interval), and
// drops the connection when the ping is not answered within
// dialKeepAliveTimeout: watches on a frozen member then move to another
// member instead of staying silent.
const (
	dialKeepAliveTime    = 10 * time.Second
	dialKeepAliveTimeout = 5 * time.Second
)

// open makes a client from u, which the driver owns, and the driver. The
// URLs of the schemes etcd and etcds:
//
//	etcd://[user:password@]host1:2379,host2:2379[/prefix]?ttl=15s
//	etcds://host1:2379/prefix?ca=/etc/etcd/ca.pem&cert=client.pem&key=client-key.pem
//
// The path, if any, is the key prefix (a slash is added at its end:
// "/locks" means prefix "locks/"). Parameters: ttl (all backends),
// dial_timeout (default 5s), request_timeout (Options.RequestTimeout,
// default 5s), and for etcds: ca (a PEM file of the CAs to
// trust; default the system pool), cert and key (a client certificate, both
// or neither), server_name (the name to verify, default the host dialled).
func open(ctx context.Context, u *url.URL, base Options) (backend.Driver, error) {
	cfg, opts, err := parseURL(u, base)
	if err != nil {
		return nil, err
	}
	cfg.Context = context.WithoutCancel(ctx)
	log := slog.Default()
	if opts.Locker != nil && opts.Locker.Logger != nil {
		log = opts.Locker.Logger
	}
	warnTransport(log, cfg)
	var up atomic.Bool // the first round trip has been answered
	cfg.Logger = zapLogger(log, &up)
	var dials urlparam.DialRecorder
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		dials.Note(err)
		return c, err
	}))
	client, err := clientv3.New(*cfg)
	if err != nil {
		// With credentials, New makes the first round trip itself (the
		// token), within DialTimeout: say why the dials failed here too.
		return nil, unavailable("connecting", dials.Explain(ctx, err, cfg.DialTimeout))
	}
	// dial_timeout bounds the first round trip (gRPC dials lazily, and
	// the client retries a failed dial until its ctx ends); the error
	// carries gRPC's last connection error (refused, x509, auth) and the
	// last dial error.
	fctx, cancel := urlparam.WithDialTimeout(ctx, cfg.DialTimeout)
	_, err = client.MemberList(fctx)
	cancel()
	if err != nil {
		_ = client.Close()
		return nil, unavailable("first round trip", dials.Explain(fctx, err, cfg.DialTimeout))
	}
	up.Store(true)
	d, err := NewDriver(ctx, client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.ownsClient = true
	return d, nil
}

// parseURL turns u into a client configuration and options (base, with the
// fields the URL names set from it), without I/O (certificate files are
// read).
func parseURL(u *url.URL, base Options) (*clientv3.Config, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: etcd: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "etcd" && u.Scheme != "etcds" {
		return nil, nil, bad("scheme %q: want etcd or etcds", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, bad("no endpoints in %s (want etcd://host:2379,host2:2379/prefix)", u.Redacted())
	}
	cfg := &clientv3.Config{
		DialTimeout:          defaultDialTimeout,
		DialKeepAliveTime:    dialKeepAliveTime,
		DialKeepAliveTimeout: dialKeepAliveTimeout,
	}
	hosts, err := urlparam.Hosts(u.Host, "2379", "endpoint")
	if err != nil {
		return nil, nil, urlparam.In("etcd", err)
	}
	for _, h := range hosts {
		scheme := "http://"
		if u.Scheme == "etcds" {
			scheme = "https://"
		}
		cfg.Endpoints = append(cfg.Endpoints, scheme+h)
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	o := base
	if p := strings.Trim(u.Path, "/"); p != "" {
		o.Prefix = p + "/"
	}
	q, err := urlparam.Query(u)
	if err != nil {
		return nil, nil, urlparam.In("etcd", err)
	}
	if cfg.DialTimeout, err = urlparam.DialTimeout(q); err != nil {
		return nil, nil, urlparam.In("etcd", err)
	}
	if v, ok, err := urlparam.Take(q, "request_timeout"); err != nil {
		return nil, nil, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 {
			return nil, nil, bad("parameter request_timeout=%q: want a positive duration such as 5s", v)
		}
		o.RequestTimeout = t
	}
	var tlsParams [4]string
	for i, name := range []string{"ca", "cert", "key", "server_name"} {
		v, ok, err := urlparam.Take(q, name)
		if err != nil {
			return nil, nil, err
		}
		if ok && u.Scheme != "etcds" {
			return nil, nil, bad("parameter %s needs the etcds scheme (TLS)", name)
		}
		tlsParams[i] = v
	}
	if err := urlparam.NoneLeft(q, "ttl", "dial_timeout", "request_timeout", "ca", "cert", "key", "server_name"); err != nil {
		return nil, nil, urlparam.In("etcd", err)
	}
	if u.Scheme == "etcds" {
		tc, err := urlparam.TLSConfig("etcd", tlsParams[0], tlsParams[1], tlsParams[2], tlsParams[3])
		if err != nil {
			return nil, nil, err
		}
		cfg.TLS = tc
	}
	return cfg, &o, nil
}

// warnTransport logs, on log, a warning for a client that sends its
// password in clear text (etcd://, no TLS) to an endpoint not on loopback.
func warnTransport(log *slog.Logger, cfg *clientv3.Config) {
	if cfg.TLS != nil || cfg.Password == "" {
		return
	}
	for _, ep := range cfg.Endpoints {
		if h := strings.TrimPrefix(ep, "http://"); !urlparam.Loopback(h) {
			log.Warn("dlock/etcd: "+urlparam.PlaintextPasswordWarning, "endpoint", h)
			return
		}
	}
}
