package redis_test

import (
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/redis"
)

// The backend's internals these tests use, registered by redis/testhooks.go.
var (
	// parseURL parses a redis:// or rediss:// URL with no base Options.
	parseURL = testhook.Get[func(*url.URL) (*goredis.Options, *redis.Options, error)]("redis.ParseURL")
	// warnTransport logs the warnings about a connection's transport.
	warnTransport = testhook.Get[func(*slog.Logger, *goredis.Options)]("redis.WarnTransport")
	// loggerOf returns the Logger d logs to.
	loggerOf = testhook.Get[func(*redis.Driver) *slog.Logger]("redis.LoggerOf")
)
