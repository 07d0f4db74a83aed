package dlock

import (
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/hook"
)

// init hands package driver what it needs of this package's internals
// (see internal/hook): driver imports dlock, so dlock cannot call it.
func init() {
	hook.NewLocker = newLocker
	hook.Build = build
	hook.OptionsFromURL = optionsFromURL
	hook.DriverOf = func(l *Locker) backend.Driver { return l.drv }
	hook.LeaseOf = func(le *Lease) backend.Lease { return le.bl }
	hook.Keys = (*Locker).keys
	hook.NewMux = func() any { return new(urlMux) }
	hook.DefaultMux = any(defaultMux)
}
