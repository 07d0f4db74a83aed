package zookeeper

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/urlparam"
)

func init() {
	dlock.DefaultURLMux().RegisterLocker("zk", &URLOpener{})
}

// URLOpener opens zk:// URLs:
//
//	zk://[user:password@]host1:2181,host2:2181[/prefix]?session_timeout=30s&ttl=20s
//
// The path is the prefix znode (default /dlock). user:password turns on
// digest authentication. Parameters: ttl (every backend), session_timeout
// (default 40s). The package registers a zero URLOpener on
// dlock.DefaultURLMux; register one of your own on a dlock.URLMux to open
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
	lo, rest, err := dlock.OptionsFromURL(u, o.Options.Locker)
	if err != nil {
		return nil, err
	}
	base := o.Options
	base.Locker = lo
	return dlock.Build(lo, limits, func() (backend.Driver, error) { return open(ctx, rest, base) })
}

// Guarantees declares, before any I/O, what every Locker the opener opens
// promises at best (dlock.GuaranteesDeclarer).
func (o *URLOpener) Guarantees() dlock.Guarantees {
	return dlock.Guarantees{Fencing: dlock.FencingConsensus}
}

// open connects to the servers of u.
func open(ctx context.Context, u *url.URL, base Options) (backend.Driver, error) {
	servers, opts, err := parseURL(u, base)
	if err != nil {
		return nil, err
	}
	return NewDriver(ctx, servers, opts)
}

// parseURL turns u into the server list and options (base, with the fields
// the URL names set from it), without I/O.
func parseURL(u *url.URL, base Options) ([]string, *Options, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: zookeeper: "+format, append([]any{backend.ErrInvalidConfig}, args...)...)
	}
	if u.Scheme != "zk" {
		return nil, nil, bad("scheme %q: want zk", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, bad("no servers in %s (want zk://host:2181,host2:2181/prefix)", u.Redacted())
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" || strings.HasPrefix(h, ":") {
			return nil, nil, bad("empty host in server list %q", u.Host)
		}
		if !strings.Contains(h, ":") || strings.HasSuffix(h, "]") {
			h += ":2181"
		}
		servers = append(servers, h)
	}
	o := base
	if p := strings.TrimRight(u.Path, "/"); p != "" {
		o.Prefix = p
	}
	if u.User != nil {
		pw, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, nil, bad("digest authentication needs user:password in the URL")
		}
		o.Auth = u.User.Username() + ":" + pw
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, bad("query of %s: %w", u.Redacted(), err)
	}
	if v, ok, err := urlparam.Take(q, "session_timeout"); err != nil {
		return nil, nil, err
	} else if ok {
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 {
			return nil, nil, bad("parameter session_timeout=%q: want a positive duration such as 30s", v)
		}
		o.SessionTimeout = t
	}
	for name := range q {
		return nil, nil, bad("unknown parameter %q (known: ttl, session_timeout)", name)
	}
	return servers, &o, nil
}
