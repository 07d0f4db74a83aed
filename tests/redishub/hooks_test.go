package redishub_test

import (
	"github.com/dlock-go/dlock/internal/redisx/redishub"
	"github.com/dlock-go/dlock/internal/testhook"
)

// The package's internals these tests use, registered by
// internal/redisx/redishub/testhooks.go.
var (
	// watchers returns the number of h's local watchers of channel (0 if
	// it is not watched).
	watchers = testhook.Get[func(h *redishub.Hub, channel string) int]("redishub.Watchers")
)
