package redis

import (
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURL exposes parseURL to the external tests.
func ParseURL(u *url.URL) (*goredis.Options, *Options, error) { return parseURL(u, Options{}) }

// WarnTransport exposes warnTransport to the external tests.
func WarnTransport(log *slog.Logger, co *goredis.Options) { warnTransport(log, co) }

// NewDriverNoIO builds a driver without the eviction check and script
// loading, for tests that need no server.
func NewDriverNoIO(client goredis.UniversalClient, opts *Options) (*Driver, error) {
	return newDriver(client, opts)
}

var AtDeadline = atDeadline
