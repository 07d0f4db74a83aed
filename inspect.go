package dlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock/backend"
)

// LockInfo is a snapshot of one key's lock: whether it is held, the holder's
// fencing token, the time left on its lease and the number of queued
// waiters, each where the backend can tell (see [backend.LockInfo]).
type LockInfo = backend.LockInfo

// Inspect reads who holds key, without changing anything: no lease is taken,
// refreshed or released. It is a diagnostic snapshot (the `dlock inspect`
// command), stale as soon as it returns; never use it to decide whether to
// act on the protected resource — acquire the lock for that.
//
// The key is checked as Acquire checks it, before any I/O (an error matching
// ErrInvalidKey). A backend that cannot inspect its locks gives an error
// matching both errors.ErrUnsupported and ErrInvalidConfig, before any I/O.
// Every backend of this repository (memory, redis, redlock, etcd, zookeeper)
// can. Errors are *[OpError] values with Op "inspect".
func (l *Locker) Inspect(ctx context.Context, key string) (LockInfo, error) {
	in, err := l.inspector()
	if err != nil {
		return LockInfo{}, opErr("inspect", key, err)
	}
	if err := l.checkKey(key); err != nil {
		return LockInfo{}, opErr("inspect", key, err)
	}
	if err := l.enter(); err != nil {
		return LockInfo{}, opErr("inspect", key, err)
	}
	defer l.inflight.Done()
	info, err := in.Inspect(ctx, key)
	if err != nil {
		return LockInfo{}, opErr("inspect", key, err)
	}
	return info, nil
}

// keys lists up to limit keys that have a holder or a queued waiter on the
// backend, under this Locker's prefix (or namespace) only, in no particular
// order; an empty list means the key space is empty. Like Inspect it changes
// nothing. A limit ≤ 0 is an error matching ErrInvalidConfig, and a backend
// that cannot list its keys one matching errors.ErrUnsupported and
// ErrInvalidConfig, both before any I/O. Errors are *[OpError] values with
// Op "keys". It is package driver's Keys, for tools (cmd/dlock compare)
// and the conformance suite.
func (l *Locker) keys(ctx context.Context, limit int) ([]string, error) {
	in, err := l.inspector()
	if err != nil {
		return nil, opErr("keys", "", err)
	}
	if limit <= 0 {
		return nil, opErr("keys", "", fmt.Errorf("%w: limit %d: want > 0", ErrInvalidConfig, limit))
	}
	if err := l.enter(); err != nil {
		return nil, opErr("keys", "", err)
	}
	defer l.inflight.Done()
	keys, err := in.Keys(ctx, limit)
	if err != nil {
		return nil, opErr("keys", "", err)
	}
	if len(keys) > limit {
		keys = keys[:limit]
	}
	return keys, nil
}

// inspector returns the driver's Inspector, or an error matching
// errors.ErrUnsupported and ErrInvalidConfig.
func (l *Locker) inspector() (backend.Inspector, error) {
	in, ok := l.drv.(backend.Inspector)
	if !ok {
		name := "this"
		if n := l.drv.Guarantees().Backend; n != "" {
			name = "the " + n
		}
		return nil, fmt.Errorf("%w: %w: %s backend cannot inspect its locks", ErrInvalidConfig, errors.ErrUnsupported, name)
	}
	return in, nil
}
