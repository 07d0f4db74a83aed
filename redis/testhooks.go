package redis

import (
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testhook"
)

// The hooks below exist for the backend's tests against real servers in
// tests/redis (the development module), which cannot reach this package's
// internals through an export_test.go. They do nothing unless a test calls
// them.
func init() {
	// The URL parser, with no base Options.
	testhook.Set("redis.ParseURL", func(u *url.URL) (*goredis.Options, *Options, error) { return parseURL(u, Options{}) })
	// The warnings about a connection's transport (a password in clear text).
	testhook.Set("redis.WarnTransport", warnTransport)
	// The Logger a driver logs to.
	testhook.Set("redis.LoggerOf", func(d *Driver) *slog.Logger { return d.log })
}
