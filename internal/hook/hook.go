// Package hook hands package dlock's unexported functions to package
// driver, which imports dlock and so cannot be imported by it. dlock's
// init sets each variable once, to a value of the type its comment names;
// driver type-asserts it at its own initialization, which comes after
// dlock's. Nothing else may use this package.
package hook

var (
	// NewLocker is func(backend.Driver, *dlock.Options) (*dlock.Locker, error).
	NewLocker any
	// Build is func(*dlock.Options, dlock.Limits, func() (backend.Driver, error)) (*dlock.Locker, error).
	Build any
	// OptionsFromURL is func(*url.URL, *dlock.Options) (*dlock.Options, *url.URL, error).
	OptionsFromURL any
	// DriverOf is func(*dlock.Locker) backend.Driver.
	DriverOf any
	// LeaseOf is func(*dlock.Lease) backend.Lease.
	LeaseOf any
	// Keys is func(*dlock.Locker, context.Context, int) ([]string, error).
	Keys any
	// NewMux is func() any, which returns a new, empty mux of dlock's
	// (a pointer to its unexported type; see driver.URLMux for its
	// methods).
	NewMux any
	// DefaultMux is the mux of dlock.Open (the same type).
	DefaultMux any
)
