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
	dlock.Register("redlock", open)
	dlock.RegisterGuarantees("redlock", dlock.Guarantees{Fencing: dlock.FencingBestEffort, ClockDependent: true, Notes: "Redlock: see the redlock package"})
}

// open is the dlock.Opener of the scheme redlock:
//
//	redlock://[[user]:password@]h1:6379,h2:6379,h3:6379[/db]?ttl=10s&prefix=dlock:&drift_factor=0.01&node_timeout=50ms
//
// The credentials and database apply to every node.
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	nodes, opts, err := parseURL(u)
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

// parseURL turns u into one client configuration per node, without I/O.
func parseURL(u *url.URL) ([]*goredis.Options, *Options, error) {
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
	var o Options
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
