package redisscript

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Snapshot is what [Inspect] reads of one lock on one server.
type Snapshot struct {
	// Held: the lock key exists.
	Held bool
	// Value is the holder's ownership value, without the waited-for
	// mark ('+', see acquire.lua).
	Value string
	// Waited: a waiter has marked the lock (acquire.lua appends '+').
	Waited bool
	// PTTL is the time left on the lock key, 0 if it has no expiry.
	PTTL time.Duration
	// Counter is the fencing counter, 0 if it is missing or not a
	// decimal number.
	Counter uint64
}

// Inspect reads the lock key lk and its fencing counter (lk + FenceSuffix)
// in one MULTI/EXEC (both are in one hash slot), writing nothing.
func Inspect(ctx context.Context, c goredis.Cmdable, lk string) (Snapshot, error) {
	var get, ctr *goredis.StringCmd
	var pttl *goredis.DurationCmd
	_, err := c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		get = p.Get(ctx, lk)
		pttl = p.PTTL(ctx, lk)
		ctr = p.Get(ctx, lk+FenceSuffix)
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return Snapshot{}, err
	}
	var s Snapshot
	v, err := get.Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return s, nil
	case err != nil:
		return Snapshot{}, err
	}
	s.Held = true
	s.Value, s.Waited = strings.CutSuffix(v, "+")
	if d, err := pttl.Result(); err == nil && d > 0 {
		s.PTTL = d
	}
	if cs, err := ctr.Result(); err == nil {
		s.Counter, _ = strconv.ParseUint(cs, 10, 64)
	} else if !errors.Is(err, goredis.Nil) {
		return Snapshot{}, err
	}
	return s, nil
}

// LockKeys lists up to limit dlock keys whose lock key (prefix + "{" + key
// + "}") exists on c, by SCAN (on every master of a Cluster). Fencing
// counters (which end with FenceSuffix, not "}") are not lock keys.
func LockKeys(ctx context.Context, c goredis.UniversalClient, prefix string, limit int) ([]string, error) {
	var keys []string
	pattern := globEscape(prefix) + "{*}"
	scan := func(ctx context.Context, c *goredis.Client) error {
		var cursor uint64
		for {
			batch, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			for _, k := range batch {
				if len(keys) == limit {
					return nil
				}
				if key, ok := strings.CutPrefix(k, prefix+"{"); ok && strings.HasSuffix(key, "}") {
					keys = append(keys, key[:len(key)-1])
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := c.(type) {
	case *goredis.Client:
		err = scan(ctx, c)
	case *goredis.ClusterClient:
		// One master at a time: the keys slice is not shared.
		var (
			mu      sync.Mutex
			masters []*goredis.Client
		)
		err = c.ForEachMaster(ctx, func(_ context.Context, m *goredis.Client) error {
			mu.Lock() // ForEachMaster runs fn concurrently
			defer mu.Unlock()
			masters = append(masters, m)
			return nil
		})
		for _, m := range masters {
			if err != nil || len(keys) == limit {
				break
			}
			err = scan(ctx, m)
		}
	default:
		return nil, errors.New("listing keys needs a *redis.Client or a *redis.ClusterClient")
	}
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// globEscape escapes the characters SCAN's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
