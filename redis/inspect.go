package redis

import (
	"context"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

var _ backend.Inspector = (*Driver)(nil)

// Inspect implements backend.Inspector: it reads the lock key's existence
// and PTTL, the key's fencing counter and, for a key held by shared
// leases, the server clock, its holders and their tokens, in one script
// (EVALSHA of a read-only script, atomic as a MULTI/EXEC, and needing no
// right to MULTI or EXEC: see the package documentation, Permissions),
// writing nothing, and at most a bounded prefix of each value (enough for
// any value a grant writes; a large value planted under the prefix is not
// read whole; the key is reported held, it blocks every acquire, with
// token 0) and at most redisscript.MaxInspectHolders (1,000) of a key's
// shared holders, each value and token cut the same way.
//
// An exclusive holder is reported as before shared leases: the token is
// the counter, which holds the token of the last grant (the holder's) — 0
// if the counter is gone while the lock key is there: lost (a restart or
// failover that lost it but not the lock key), or expired (FenceRetention
// after the grant's TTL, under a lock refreshed for longer than that).
// Holder is the holder description, which the lock key's value carries
// before the 32 hex digits of the grant's ownership part (see the package
// documentation, How it works); a value that does not end with such an
// ownership part (planted by something else), or is longer than a grant
// writes, is reported held with Holder "". Holders lists the one lease.
//
// A key held by shared leases (see the package documentation, Shared
// leases) is reported with Shared, its Permits, and every valid lease in
// Holders, oldest grant first (by token), each with its own token, TTL
// (the server's clock against the lease's expiry) and holder; Token, TTL
// and Holder are those of Holders[0]. A key reserved for a waiting writer
// has no holder: it is reported free, and so is a key whose shared
// holders have all expired while a writer's reservation runs on. Waiters
// is -1: Redis keeps no queue
// (a waiter only marks the lock as waited for).
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	s, err := redisscript.InspectShared(ctx, d.client, d.lockKey(key))
	if err != nil {
		return backend.LockInfo{}, unavailable(err)
	}
	info := backend.LockInfo{Waiters: -1}
	switch {
	case !s.Held:
	case s.Shared:
		info.Shared, info.Permits = true, s.Kind.Permits
		for _, h := range s.Holders {
			info.Holders = append(info.Holders, backend.Holding{Token: backend.Token(h.Token), TTL: h.TTL, Holder: h.Holder})
		}
	default:
		info.Holders = []backend.Holding{{Token: backend.Token(s.Counter), TTL: s.PTTL, Holder: s.Holder}}
	}
	if len(info.Holders) > 0 {
		h := info.Holders[0]
		info.Held, info.Token, info.TTL, info.Holder = true, h.Token, h.TTL, h.Holder
	}
	return info, nil
}

// Keys implements backend.Inspector: the held keys under the Driver's
// prefix, by SCAN (on every master of a Cluster). A key held by shared
// leases has a lock key too (see the package documentation, Shared
// leases), and so has a key reserved for a waiting writer, which is
// listed as a key with a waiter.
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	keys, err := redisscript.LockKeys(ctx, d.client, d.prefix, limit)
	if err != nil {
		return nil, unavailable(err)
	}
	return keys, nil
}
