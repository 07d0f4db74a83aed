package redis_test

import (
	"log/slog"

	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/redis"
)

// The backend's internals these tests use, registered by redis/testhooks.go.
var (
	// loggerOf returns the Logger d logs to.
	loggerOf = testhook.Get[func(*redis.Driver) *slog.Logger]("redis.LoggerOf")
)
