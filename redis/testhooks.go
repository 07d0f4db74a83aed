package redis

import (
	"log/slog"

	"github.com/dlock-go/dlock/internal/testhook"
)

// The hooks below exist for the backend's tests against real servers in
// tests/redis (the development module), which cannot reach this package's
// internals through an export_test.go. They do nothing unless a test calls
// them.
func init() {
	// The Logger a driver logs to.
	testhook.Set("redis.LoggerOf", func(d *Driver) *slog.Logger { return d.log })
}
