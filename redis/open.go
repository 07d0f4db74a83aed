package redis

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	dlock.Register("redis", open)
	dlock.Register("rediss", open)
	g := dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "single Redis: see the redis package"}
	dlock.RegisterGuarantees("redis", g)
	dlock.RegisterGuarantees("rediss", g)
}

// New checks opts and the server's eviction policy, loads the scripts, and
// returns a Locker over client, configured by opts.Locker. It does not take
// ownership of client: closing the Locker leaves the client open.
//
// client may be a *goredis.Client (one server, or a Sentinel failover
// client) or a *goredis.ClusterClient. A *goredis.Ring is refused: it moves
// keys to another shard when one looks unhealthy, which would let two
// holders take the same lock. Errors wrap [backend.ErrInvalidConfig] or
// [backend.ErrUnavailable].
func New(ctx context.Context, client goredis.UniversalClient, opts *Options) (*dlock.Locker, error) {
	d, err := NewDriver(ctx, client, opts)
	if err != nil {
		return nil, err
	}
	var lo *dlock.Options
	if opts != nil {
		lo = opts.Locker
	}
	return dlock.New(d, lo), nil
}

// open is the dlock.Opener of the schemes redis and rediss.
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	clientOpts, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	// Honour ctx deadlines and cancellation on the socket, not only while
	// waiting for a pooled connection.
	clientOpts.ContextTimeoutEnabled = true
	client := goredis.NewClient(clientOpts) // no I/O yet
	d, err := newDriver(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.ownsClient = true
	if err := d.start(ctx); err != nil {
		_ = client.Close()
		return nil, err
	}
	return d, nil
}

// parseURL splits u into the backend's options and go-redis's client
// options. It does no I/O.
func parseURL(u *url.URL) (*goredis.Options, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: redis: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, nil, bad("scheme %q: want redis or rediss", u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, bad("query of %s: %w", u.Redacted(), err)
	}
	var o Options
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
	rest := *u
	rest.RawQuery = q.Encode()
	co, err := goredis.ParseURL(rest.String())
	if err != nil {
		// go-redis rejects unknown parameters ("unexpected option") and bad
		// values; its messages do not include the password.
		// go-redis's messages begin with "redis: " already.
		return nil, nil, fmt.Errorf("%w: %w", backend.ErrInvalidConfig, err)
	}
	return co, &o, nil
}
