package redlock

import (
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURL exposes parseURL to the external tests.
func ParseURL(u *url.URL) ([]*goredis.Options, *Options, error) { return parseURL(u, Options{}) }

// WarnTransport exposes warnTransport to the external tests.
func WarnTransport(log *slog.Logger, nodes []*goredis.Options) { warnTransport(log, nodes) }
