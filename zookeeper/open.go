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
	dlock.Register("zk", open)
	dlock.RegisterGuarantees("zk", dlock.Guarantees{Fencing: dlock.FencingConsensus})
}

// open is the dlock.Opener of the scheme zk:
//
//	zk://[user:password@]host1:2181,host2:2181[/prefix]?session_timeout=30s&ttl=20s
//
// The path is the prefix znode (default /dlock). user:password turns on
// digest authentication. Parameters: ttl (every backend), session_timeout
// (default 40s).
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	servers, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return NewDriver(ctx, servers, opts)
}

// parseURL turns u into the server list and options, without I/O.
func parseURL(u *url.URL) ([]string, *Options, error) {
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
	var o Options
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
