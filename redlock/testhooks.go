package redlock

import "github.com/dlock-go/dlock/internal/testhook"

// The hooks below exist for the backend's tests against real servers in
// tests/redlock (the development module), which cannot reach this
// package's internals through an export_test.go. They do nothing unless a
// test calls them.
func init() {
	// AfterGrant makes d call f in each TryAcquire once a majority has
	// granted, before the grant's validity (TTL − elapsed − drift) is
	// computed: f may pause there, as a GC or a stopped process would.
	testhook.Set("redlock.AfterGrant", func(d *Driver, f func()) { d.afterGrant = f })
}
