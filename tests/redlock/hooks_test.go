package redlock_test

import (
	"github.com/dlock-go/dlock/internal/testhook"
	"github.com/dlock-go/dlock/redlock"
)

// The backend's internals these tests use, registered by
// redlock/testhooks.go.
var (
	// afterGrant makes d call f in each TryAcquire once a majority has
	// granted, before the grant's validity is computed.
	afterGrant = testhook.Get[func(d *redlock.Driver, f func())]("redlock.AfterGrant")
)
