package redis

import (
	"context"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
)

var _ backend.Inspector = (*Driver)(nil)

// Inspect implements backend.Inspector: it reads the lock key's existence
// and PTTL and the key's fencing counter in one MULTI/EXEC, writing
// nothing, and at most a bounded prefix of each value (enough for any
// value a grant writes; a large value planted under the prefix is not read
// whole; the key is reported held, it blocks every acquire, with token 0).
// The token is the counter, which holds the token of the last grant (the
// holder's) — 0 if the counter is gone while the lock key is there: lost
// (a restart or failover that lost it but not the lock key), or expired
// (FenceRetention after the grant's TTL, under a lock refreshed for longer
// than that). Holder is the holder description, which the lock key's value
// carries before the 32 hex digits of the grant's ownership part (see the
// package documentation, How it works); a value that does not end with
// such an ownership part (planted by something else), or is longer than a
// grant writes, is reported held with Holder "". Waiters is -1: Redis
// keeps no queue (a waiter only marks the lock as waited for).
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	s, err := redisscript.Inspect(ctx, d.client, d.lockKey(key))
	if err != nil {
		return backend.LockInfo{}, unavailable(err)
	}
	if !s.Held {
		return backend.LockInfo{Waiters: -1}, nil
	}
	return backend.LockInfo{Held: true, Token: backend.Token(s.Counter), TTL: s.PTTL, Holder: s.Holder, Waiters: -1}, nil
}

// Keys implements backend.Inspector: the held keys under the Driver's
// prefix, by SCAN (on every master of a Cluster).
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	keys, err := redisscript.LockKeys(ctx, d.client, d.prefix, limit)
	if err != nil {
		return nil, unavailable(err)
	}
	return keys, nil
}
