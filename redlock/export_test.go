package redlock

// AfterGrant makes d call f in each TryAcquire once a majority has granted,
// before the grant's validity (TTL − elapsed − drift) is computed: f may
// pause there, as a GC or a stopped process would.
func AfterGrant(d *Driver, f func()) { d.afterGrant = f }
