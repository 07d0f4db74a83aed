package redis

import (
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// WarnTransport exposes warnTransport to the external tests.
func WarnTransport(log *slog.Logger, co *goredis.Options) { warnTransport(log, co) }
