// Package fence is the resource side of fencing tokens: checks that let a
// write through only if its token is at least the highest the resource has
// seen, and reject it with [ErrStaleToken] otherwise (Kleppmann, "How to do
// distributed locking"). A lock's token is worth nothing unless the
// protected resource checks it: a holder that paused past its lease still
// believes it holds the lock, and only the resource can refuse its late
// write.
//
// Equal tokens pass (the same holder's repeated writes); lower ones fail.
// Each check is atomic with its write. The stores share one verb, [Store]'s
// Set(ctx, key, value, token), with the same errors:
//
//   - [Guard]: in memory, for tests and for wrapping any Go resource.
//   - [SQLTable]: a conditional upsert in one statement (PostgreSQL).
//   - redis.FenceStore (package redis, with go-redis): a Lua check-and-set
//     next to the data.
//   - etcd.FenceStore (the etcd module): a transaction comparing the token
//     stored beside the data. (To
//     fence an etcd write with no extra state, put the lock's own
//     ownership comparison in the write's transaction instead:
//     etcd.OwnerOf(lease).Cmp().)
//   - [Middleware]: an HTTP handler wrapper that reads the token from a
//     request header, for services that sit behind a lock.
package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/fencecheck"
)

// ErrStaleToken: a write carried a token lower than the highest the
// resource has seen; it was not applied.
var ErrStaleToken = errors.New("fence: stale token")

// StaleError is the error of a rejected write. It matches [ErrStaleToken].
type StaleError struct {
	Resource string
	Token    dlock.Token // the write's token
	Highest  dlock.Token // the highest the resource had seen
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale token %d for %q: %d was seen already", e.Token, e.Resource, e.Highest)
}

// Unwrap makes a StaleError match ErrStaleToken.
func (e *StaleError) Unwrap() error { return ErrStaleToken }

// Guard checks tokens in memory, per resource name, in this process only
// (a restarted process, or a second replica, has not seen the highest
// token: use a shared store's guard there). The zero value is ready to use;
// it is safe for concurrent use. It remembers every resource name it has
// seen.
type Guard struct {
	mu        sync.Mutex
	resources map[string]*guarded
}

// guarded is one resource's check: its lock is held for the whole write.
type guarded struct {
	mu      sync.Mutex
	highest dlock.Token
}

func (g *Guard) resource(name string) *guarded {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.resources[name]
	if r == nil {
		if g.resources == nil {
			g.resources = map[string]*guarded{}
		}
		r = &guarded{}
		g.resources[name] = r
	}
	return r
}

// Do runs write if token is at least the highest token seen for resource,
// holding the resource's check (and only that resource's) for the whole
// write, so that no lower token can slip in. Once the check passes the
// token counts as seen, even if write then fails: a write may have been
// partly applied, and a higher token proves every lower holder has lost
// the lock. A lower token gets a *StaleError and write does not run. Token
// 0 (a backend without fencing) is an error wrapping ErrInvalidConfig.
func (g *Guard) Do(resource string, token dlock.Token, write func() error) error {
	if token == 0 {
		return fencecheck.NoToken(resource)
	}
	r := g.resource(resource)
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		return &StaleError{Resource: resource, Token: token, Highest: r.highest}
	}
	r.highest = token
	return write()
}

// Highest returns the highest token a write to resource has carried.
func (g *Guard) Highest(resource string) dlock.Token {
	r := g.resource(resource)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.highest
}

// Store is a fenced key-value store: [SQLTable] has it, and so have
// redis.FenceStore (package redis) and etcd.FenceStore (the etcd module),
// which live with their clients so that this package needs none. Set
// writes value under key if token is at least the highest token a write to
// key has carried (equal tokens pass) and records token, in one atomic
// step. A lower token gets a *StaleError (matching ErrStaleToken)
// and changes nothing. Token 0, an empty key or a missing client is an
// error wrapping dlock.ErrInvalidConfig, before any I/O; a failure of the
// store wraps dlock.ErrUnavailable.
type Store interface {
	Set(ctx context.Context, key, value string, token dlock.Token) error
}

var (
	_ Store = SQLTable{}
)
