package redlock

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	dlock.DefaultURLMux().RegisterLocker("redlock", &URLOpener{})
}

// URLOpener opens redlock:// URLs:
//
//	redlock://[[user]:password@]h1:6379,h2:6379,h3:6379[/db]?ttl=10s&prefix=dlock:&drift_factor=0.01&node_timeout=50ms
//
// The credentials and database apply to every node. The package registers
// a zero URLOpener on dlock.DefaultURLMux; register one of your own on a
// dlock.URLMux to open URLs with your own clients, Logger or Options.
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
	lo, rest, err := dlock.OptionsFromURL(u, o.Options.Locker)
	if err != nil {
		return nil, err
	}
	base := o.Options
	base.Locker = lo
	if o.Clients != nil {
		_, opts, err := parseURL(rest, base)
		if err != nil {
			return nil, err
		}
		return New(ctx, o.Clients, opts)
	}
	return dlock.Build(lo, limits, func() (backend.Driver, error) { return open(ctx, rest, base) })
}

// Guarantees declares, before any I/O, what every Locker the opener opens
// promises at best (dlock.GuaranteesDeclarer).
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
	for i, o := range nodes {
		clients[i] = goredis.NewClient(o)
	}
	d, err := NewDriver(ctx, clients, opts)
	if err != nil {
		for _, c := range clients {
			_ = c.Close()
		}
		return nil, err
	}
	d.ownsClients = true
	return d, nil
}

// parseURL turns u into one client configuration per node and the options
// (base, with the fields the URL names set from it), without I/O.
func parseURL(u *url.URL, base Options) ([]*goredis.Options, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: redlock: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "redlock" {
		return nil, nil, bad("scheme %q: want redlock", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, bad("no nodes in %s (want redlock://h1:6379,h2:6379,h3:6379)", u.Redacted())
	}
	db := 0
	if p := strings.Trim(u.Path, "/"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, nil, bad("database %q: want a number", p)
		}
		db = n
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, bad("query of %s: %w", u.Redacted(), err)
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
		if err != nil || f <= 0 || f >= 0.5 {
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
	for name := range q {
		return nil, nil, bad("unknown parameter %q (known: ttl, prefix, drift_factor, node_timeout)", name)
	}
	var nodes []*goredis.Options
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" || strings.HasPrefix(h, ":") {
			return nil, nil, bad("empty host in node list %q", u.Host)
		}
		if !strings.Contains(h, ":") || strings.HasSuffix(h, "]") {
			h += ":6379"
		}
		// A node listed twice, under any spelling, is refused by
		// NewDriver (checkServers).
		co := &goredis.Options{Addr: h, DB: db, ContextTimeoutEnabled: true}
		if u.User != nil {
			co.Username = u.User.Username()
			co.Password, _ = u.User.Password()
		}
		nodes = append(nodes, co)
	}
	return nodes, &o, nil
}
