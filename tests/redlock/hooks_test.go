package redlock_test

import (
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/redlock"
)

// The backend's internals these tests use, registered by
// redlock/testhooks.go.
var (
	// afterGrant makes d call f in each TryAcquire once a majority has
	// granted, before the grant's validity is computed.
	afterGrant = testhook.Get[func(d *redlock.Driver, f func())]("redlock.AfterGrant")
	// parseURL parses a redlock:// or redlocks:// URL with no base Options.
	parseURL = testhook.Get[func(*url.URL) ([]*goredis.Options, *redlock.Options, error)]("redlock.ParseURL")
	// warnTransport logs the warnings about the nodes' transport.
	warnTransport = testhook.Get[func(*slog.Logger, []*goredis.Options)]("redlock.WarnTransport")
)
