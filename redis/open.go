package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	m := driver.DefaultURLMux()
	m.RegisterLocker("redis", &URLOpener{})
	m.RegisterLocker("rediss", &URLOpener{})
}

// URLOpener opens redis:// and rediss:// URLs (see the package
// documentation for their parameters). The package registers a zero
// URLOpener on driver.DefaultURLMux; register one of your own on a
// driver.URLMux to open URLs with your own client, Logger or Options.
type URLOpener struct {
	// Client, if set, is the client every URL opens on (it stays the
	// caller's: closing the Locker leaves it open); the URL's host,
	// credentials, database and go-redis parameters are then not used.
	// Default nil: a client is made from the URL, and closed with the
	// Locker.
	Client goredis.UniversalClient
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
	return dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "single Redis: see the redis package"}
}

// New checks opts and the server's eviction policy, loads the scripts, and
// returns a Locker over client, configured by opts.Locker (whose Logger the
// backend logs to as well). It does not take ownership of client: closing
// the Locker leaves the client open.
//
// client may be a *goredis.Client (one server, or a Sentinel failover
// client) or a *goredis.ClusterClient. A *goredis.Ring is refused: it moves
// keys to another shard when one looks unhealthy, which would let two
// holders take the same lock. Errors wrap [backend.ErrInvalidConfig]
// (bad options, opts.Locker included, before any I/O) or
// [backend.ErrUnavailable].
func New(ctx context.Context, client goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return driver.Build(lo, limits, func() (backend.Driver, error) { return NewDriver(ctx, client, opts) })
}

// open makes a client from u, which it owns, and the driver over it.
func open(ctx context.Context, u *url.URL, base Options) (backend.Driver, error) {
	clientOpts, opts, err := parseURL(u, base)
	if err != nil {
		return nil, err
	}
	// Honour ctx deadlines and cancellation on the socket, not only while
	// waiting for a pooled connection.
	clientOpts.ContextTimeoutEnabled = true
	client := goredis.NewClient(clientOpts) // no I/O yet
	var dials urlparam.DialRecorder
	client.AddHook(dialHook{&dials})
	d, err := newDriver(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.ownsClient = true
	warnTransport(d.log, clientOpts)
	// dial_timeout bounds the first round trip (the eviction check and
	// the script loads), dials and their retries included; the error says
	// why the dials failed.
	sctx, cancel := urlparam.WithDialTimeout(ctx, clientOpts.DialTimeout)
	defer cancel()
	if err := d.start(sctx); err != nil {
		_ = client.Close()
		return nil, dials.Explain(sctx, err, clientOpts.DialTimeout)
	}
	return d, nil
}

// dialHook records the client's failed dials (TLS handshakes included).
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

// parseURL splits u into the backend's options (base, with the fields the
// URL names set from it) and go-redis's client options. It does no I/O.
func parseURL(u *url.URL, base Options) (*goredis.Options, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: redis: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, nil, bad("scheme %q: want redis or rediss", u.Scheme)
	}
	// go-redis would dial localhost:6379 for an empty host, and take any
	// port: check them here, before any I/O.
	if _, err := urlparam.Hosts(u.Host, "6379", "server"); err != nil {
		return nil, nil, urlparam.In("redis", err)
	}
	if strings.Contains(u.Host, ",") {
		return nil, nil, bad("one server per URL, not %q (several independent masters: the redlock scheme)", u.Host)
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 0 || strings.Trim(p, "0123456789") != "" {
			return nil, nil, bad("database %q: want a number ≥ 0", p)
		}
	}
	q, err := urlparam.Query(u)
	if err != nil {
		return nil, nil, urlparam.In("redis", err)
	}
	dialTimeout, err := urlparam.DialTimeout(q)
	if err != nil {
		return nil, nil, urlparam.In("redis", err)
	}
	o := base
	if v, ok, err := urlparam.Take(q, "prefix"); err != nil {
		return nil, nil, err
	} else if ok {
		o.Prefix = v
	}
	if v, ok, err := urlparam.Take(q, "wait_replicas"); err != nil {
		return nil, nil, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, nil, bad("parameter wait_replicas=%q: want a number ≥ 0", v)
		}
		o.WaitReplicas = n
	}
	if v, ok, err := urlparam.Take(q, "wait_timeout"); err != nil {
		return nil, nil, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t < time.Millisecond {
			return nil, nil, bad("parameter wait_timeout=%q: want a duration of at least 1ms, such as 250ms", v)
		}
		o.WaitTimeout = t
	}
	if v, ok, err := urlparam.Take(q, "fence_retention"); err != nil {
		return nil, nil, err
	} else if ok {
		t, err := time.ParseDuration(v)
		switch {
		case v == "never":
			o.FenceRetention = -1
		case err != nil || t < time.Millisecond:
			return nil, nil, bad("parameter fence_retention=%q: want a duration of at least 1ms, such as 1h, or never", v)
		default:
			o.FenceRetention = t
		}
	}
	if v, ok, err := urlparam.Take(q, "eviction_check"); err != nil {
		return nil, nil, err
	} else if ok {
		switch v {
		case "refuse":
			o.EvictionCheck = EvictionRefuse
		case "warn":
			o.EvictionCheck = EvictionWarn
		case "ignore":
			o.EvictionCheck = EvictionIgnore
		default:
			return nil, nil, bad("parameter eviction_check=%q: want refuse, warn or ignore", v)
		}
	}
	// TLS: ca, cert, key and server_name are ours (go-redis has none of
	// them), for rediss only; skip_verify is go-redis's.
	var tlsParams [4]string
	for i, name := range tlsParamNames {
		v, ok, err := urlparam.Take(q, name)
		if err != nil {
			return nil, nil, urlparam.In("redis", err)
		}
		if ok && u.Scheme != "rediss" {
			return nil, nil, bad("parameter %s needs the rediss scheme (TLS)", name)
		}
		tlsParams[i] = v
	}
	// The go-redis parameters we pass through, checked here: go-redis
	// takes any int (pool_size=-5 or 3000000000 panics when the client is
	// made) and reports an unknown one without the list of known ones.
	if err := checkGoredisParams(q, u.Scheme == "rediss"); err != nil {
		return nil, nil, urlparam.In("redis", err)
	}
	rest := *u
	rest.RawQuery = q.Encode()
	co, err := goredis.ParseURL(rest.String())
	var ue *url.Error
	switch {
	case errors.As(err, &ue):
		// Not err: a url.Error quotes the whole URL, password included.
		// (rest parsed once already; not expected.)
		return nil, nil, fmt.Errorf("%w: redis: the URL does not parse again once its parameters are taken (its text is not shown: it may hold a password)", backend.ErrInvalidConfig)
	case err != nil:
		// Bad values the checks above let through; go-redis's own
		// messages name the parameter, not the URL, and begin with
		// "redis: " already.
		return nil, nil, fmt.Errorf("%w: %w", backend.ErrInvalidConfig, err)
	}
	co.DialTimeout = dialTimeout
	if co.TLSConfig != nil {
		tc, err := urlparam.TLSConfig("redis", tlsParams[0], tlsParams[1], tlsParams[2], tlsParams[3])
		if err != nil {
			return nil, nil, err
		}
		if tc.ServerName == "" {
			tc.ServerName = co.TLSConfig.ServerName // the host dialled
		}
		tc.InsecureSkipVerify = co.TLSConfig.InsecureSkipVerify // skip_verify
		co.TLSConfig = tc
	}
	return co, &o, nil
}

// tlsParamNames are the TLS parameters of rediss URLs, in the order of
// urlparam.TLSConfig's arguments.
var tlsParamNames = []string{"ca", "cert", "key", "server_name"}

// warnTransport logs, on log, a warning for a client whose connection
// anyone on the network path can read: TLS without certificate checks
// (skip_verify=true), or a password sent in clear text to a server not on
// loopback.
func warnTransport(log *slog.Logger, co *goredis.Options) {
	switch {
	case co.TLSConfig != nil && co.TLSConfig.InsecureSkipVerify:
		log.Warn("dlock/redis: "+urlparam.SkipVerifyWarning, "server", co.Addr)
	case co.TLSConfig == nil && co.Password != "" && !urlparam.Loopback(co.Addr):
		log.Warn("dlock/redis: "+urlparam.PlaintextPasswordWarning, "server", co.Addr)
	}
}
