package matrix_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/internal/redisx/redisscript"
	"github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/tests/servers"
)

// Shared leases in the explorer (issue 24). On a backend whose
// Guarantees().Shared is true, some keys may be taken shared as well as
// exclusively, each always in one way (xshares): the first key is a
// semaphore of explorePermits permits, the second a read-write lock, the
// third stays a plain mutex; a client's own key is a semaphore (even
// clients) or a read-write lock (odd ones). An operation on such a key
// draws, from the client's seeded source, whether it takes the key shared
// or as the writer (the exclusive path, with its fenced register writes).
// Shared holders never write the register (they hold together by design):
// a reader reads it with its token, a permit holder only waits; both
// hold, refresh (by hand and with AutoRefresh), release and are lost to
// the faults as exclusive leases are, and every audit applies to them
// (the Redis auditor reads the shared layout: the holders' sorted set and
// their tokens). The checker judges them by the permit count (never more
// valid permits than the semaphore's size) and shared-never-with-exclusive.
//
// Now and then a holder of a shared lease asks for the same key with
// another Permits (a permit of another size, or a reader on a semaphore's
// key, or a permit on a read-write lock's key): while its own lease is
// valid, the request must fail at once with a *dlock.PermitsError, neither
// waiting nor taking anything. It is recorded in the history as a failed
// acquire, which the safety checks ignore (and, were it granted, as a
// lease the permit count would judge); the explorer reports a grant, a
// wait or another error as a finding.
//
// The "lock dropped" fault drops shared leases too: on etcd and ZooKeeper
// the oldest entry of the key's queue (a holder, named by its token), on
// Redis every holder of the key at once (the lock key and the holders'
// sorted set and tokens, each token recorded), as an expiry would.

// explorePermits is the size of the explorer's semaphores.
const explorePermits = 2

// xshare is how an acquire takes its key: exclusively (the zero xshare),
// as a reader of a read-write lock (shared, permits 0), or as one permit
// of a semaphore of permits.
type xshare struct {
	shared  bool
	permits int
}

// options returns the AcquireOptions of an acquire of s.
func (s xshare) options(ttl time.Duration, auto bool) *dlock.AcquireOptions {
	return &dlock.AcquireOptions{TTL: ttl, AutoRefresh: auto, MaxHold: time.Hour, Shared: s.shared, Permits: s.permits}
}

func (s xshare) String() string {
	switch {
	case !s.shared:
		return "exclusive"
	case s.permits == 0:
		return "reader"
	}
	return fmt.Sprintf("permit of %d", s.permits)
}

// setShares decides which keys may be taken shared, on a backend that
// serves shared leases.
func (x *explorer) setShares() {
	x.shares = map[string]xshare{}
	if !x.g.Shared {
		return
	}
	x.shares[x.keys[0]] = xshare{shared: true, permits: explorePermits}
	x.shares[x.keys[1]] = xshare{shared: true}
	for i, c := range x.clients {
		if i%2 == 0 {
			x.shares[c.own] = xshare{shared: true, permits: explorePermits}
		} else {
			x.shares[c.own] = xshare{shared: true}
		}
	}
}

// shareFor draws how c takes key this time: a key that may be taken
// shared is, two times in three for a semaphore and half of the time
// otherwise; else (and always on the other keys) exclusively. A key that
// is exclusive only draws nothing, so a backend without shared leases
// draws as it did before them.
func (c *xclient) shareFor(key string) xshare {
	s, ok := c.x.shares[key]
	if !ok {
		return xshare{}
	}
	n := 2
	if s.permits > 0 {
		n = 3
	}
	if c.rng.IntN(n) == 0 {
		return xshare{}
	}
	return s
}

// sharedCritical is a shared holder's critical section, of hold: a reader
// reads the key's register with its token (as a resource that checks
// tokens would let it: refused once a later writer has written), a permit
// holder only waits. Neither writes.
func (c *xclient) sharedCritical(le *check.Lease, sh xshare, hold time.Duration) {
	if sh.permits == 0 {
		if _, ok := c.x.regs[le.Key()].Read(le.Token()); !ok {
			c.x.add("reader refused by the register")
		}
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-t.C:
	case <-le.Done():
	case <-c.x.t.Context().Done():
	}
}

// The kinds of finding about shared leases.
const (
	kindMismatchGranted  = "permits mismatch granted"
	kindMismatchRefused  = "permits mismatch not refused at once"
	kindMismatchSpurious = "PermitsError without a mismatch"
)

// probing reports whether a mismatch was asked on key between from and to,
// or is still being asked: while one is in a backend's queue, a request
// with the key's own Permits that finds it ahead fails with a
// PermitsError, as it must. Its entry may stay there a while after it
// failed, when its removal failed (etcd then revokes the lease it is on,
// in the background if need be, until that lease runs out): a TTL and 2 s
// more are allowed for that.
func (x *explorer) probing(key string, from, to time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, w := range x.probes {
		if w.key == key && !w.from.After(to) && (w.to.IsZero() || !w.to.Add(x.maxTTL+2*time.Second).Before(from)) {
			return true
		}
	}
	return false
}

// mismatch asks, while c holds le (a shared lease sh of key), for key
// with another Permits, by Acquire or TryAcquire: as long as le is a
// valid holder, the request must fail at once with a *dlock.PermitsError
// that names the Permits asked.
func (c *xclient) mismatch(le *check.Lease, sh xshare) {
	x := c.x
	key := le.Key()
	other := xshare{shared: true}
	switch {
	case sh.permits == 0:
		other.permits = explorePermits + c.rng.IntN(2) // a permit on a read-write lock's key
	case c.rng.IntN(3) == 0:
		// a reader on a semaphore's key
	default:
		other.permits = sh.permits + 1 + c.rng.IntN(2)
	}
	wait := c.rng.IntN(2) == 0
	ttl := c.pickTTL()
	x.add("op acquire permits mismatch")
	ctx, cancel := context.WithTimeout(x.t.Context(), 5*time.Second)
	start := time.Now()
	x.mu.Lock()
	probe := len(x.probes)
	x.probes = append(x.probes, keyWindow{key, window{from: start}}) // to: below
	x.mu.Unlock()
	defer func() {
		x.mu.Lock()
		x.probes[probe].to = time.Now()
		x.mu.Unlock()
	}()
	var (
		got *check.Lease
		err error
	)
	if wait {
		got, err = x.e.h.Acquire(ctx, c.name, c.locker(), key, other.options(ttl, false))
	} else {
		got, err = x.e.h.TryAcquire(ctx, c.name, c.locker(), key, other.options(ttl, false))
	}
	cancel()
	end := time.Now()
	// Judged only while le was valid from before the request until after
	// its answer and nothing the explorer did may have dropped it: le then
	// held the key with sh's Permits throughout.
	judged := le.Err() == nil && le.Deadline().After(end) && !x.expiredBetween(key, start, end)
	var pe *dlock.PermitsError
	switch {
	case err == nil:
		x.granted(got, ttl, false, other)
		x.add("op release")
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(x.t.Context()), 10*time.Second)
		rerr := got.Release(rctx)
		rcancel()
		if judged {
			x.find(got.ID(), start, end, kindMismatchGranted, "acquire #%d (%s, key %q) of a %v was granted token %d while lease #%d (token %d, a %v) held the key (released again: %v)",
				got.ID(), c.name, key, other, got.Token(), le.ID(), le.Token(), sh, rerr)
		}
	case errors.As(err, &pe):
		x.add("permits mismatch refused")
		if pe.Asked != other.permits && judged {
			x.find(le.ID(), start, end, kindMismatchRefused, "acquire (%s, key %q) of a %v failed with a PermitsError that names %d permits asked, while lease #%d (a %v) held the key: %v",
				c.name, key, other, pe.Asked, le.ID(), sh, err)
		}
	case judged && !x.faultedBetween(c.name, start.Add(-time.Second), end):
		x.find(le.ID(), start, end, kindMismatchRefused, "acquire (%s, key %q, wait %v) of a %v failed after %v with no PermitsError, while lease #%d (a %v) held the key and no fault was injected: %v",
			c.name, key, wait, other, end.Sub(start).Round(time.Millisecond), le.ID(), sh, err)
	}
}

// redisDropAll drops the lock of a key on a single Redis server as an
// expiry would, whichever way it is held, and returns the tokens of the
// leases it ended: an exclusive lock key (its fencing counter holds the
// holder's token: nothing is granted while it holds); or the lock key of
// shared holders with their sorted set and tokens, every holder's token
// (tokens of holders already expired but not yet pruned come too: ending
// them again is harmless). A key reserved for a waiting writer has no
// holder and is left alone.
//
// KEYS[1]: the lock key; KEYS[2]: its fencing counter; KEYS[3], KEYS[4]:
// its holders and their tokens.
var redisDropAll = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
	return {}
end
if string.byte(v, 1) == 0 then
	if string.byte(v, 2) ~= 115 then
		return {}
	end
	local tokens = redis.call('HVALS', KEYS[4])
	redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
	return tokens
end
redis.call('DEL', KEYS[1])
return {redis.call('GET', KEYS[2]) or '0'}`)

// redisExpireShared is the explorer's "lock dropped" fault on a single
// Redis server (see redisDropAll).
func redisExpireShared(t *testing.T, srv *servers.Server) func(context.Context, string) (bool, []dlock.Token, error) {
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return func(ctx context.Context, key string) (bool, []dlock.Token, error) {
		lock := redis.DefaultPrefix + "{" + key + "}"
		vs, err := redisDropAll.Run(ctx, c, []string{lock, lock + redisscript.FenceSuffix, lock + redisscript.HoldersSuffix, lock + redisscript.TokensSuffix}).StringSlice()
		if err != nil {
			return false, nil, err
		}
		var toks []dlock.Token
		for _, v := range vs {
			n, err := redisCounter(v) // a token, or the counter (tombstones and all)
			if err != nil {
				return true, nil, err
			}
			toks = append(toks, dlock.Token(n))
		}
		return len(toks) > 0, toks, nil
	}
}

// redisStateProbe reads the state of a key on a single Redis server for
// a lease with token ARGV[1] (KEYS as redisDropAll's), in one script:
// {0, pttl, counter} when the lock key is free (PTTL -2) or holds an
// exclusive lock (the fencing counter is then its token); {1} when it is
// held by shared leases none of which has the token; {2, ms} when one
// has, ms being the time left until its score (its expiry on the server
// clock, ≤ 0 once passed and not yet pruned); {3} when it is reserved for
// a waiting writer (no holder).
var redisStateProbe = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, 1) ~= 0 then
	return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0'}
end
if string.byte(v, 2) ~= 115 then
	return {3}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kv = redis.call('HGETALL', KEYS[4])
for i = 1, #kv, 2 do
	if kv[i + 1] == ARGV[1] then
		local s = redis.call('ZSCORE', KEYS[3], kv[i])
		if s then
			return {2, tonumber(s) - now}
		end
	end
end
return {1}`)

// redisKeyState is a key's state on a Redis server, as redisStateProbe
// reads it for a lease's token.
type redisKeyState struct {
	kind    int // 0: free or exclusive; 1: shared, not the lease; 2: shared, the lease among the holders; 3: reserved for a writer
	pttl    int64
	counter uint64
	left    time.Duration // kind 2: until the lease's score
}

// redisState reads key's state on c for token (see redisStateProbe).
func redisState(ctx context.Context, c *goredis.Client, key string, token dlock.Token) (redisKeyState, error) {
	lock := redis.DefaultPrefix + "{" + key + "}"
	v, err := redisStateProbe.Run(ctx, c, []string{lock, lock + redisscript.FenceSuffix, lock + redisscript.HoldersSuffix, lock + redisscript.TokensSuffix},
		strconv.FormatUint(uint64(token), 10)).Slice()
	if err != nil {
		return redisKeyState{}, err
	}
	var st redisKeyState
	if len(v) > 0 {
		k, _ := v[0].(int64)
		st.kind = int(k)
	}
	switch {
	case st.kind == 0 && len(v) == 3:
		st.pttl, _ = v[1].(int64)
		s, _ := v[2].(string)
		st.counter, err = redisCounter(s)
		return st, err
	case (st.kind == 1 || st.kind == 3) && len(v) == 1:
		return st, nil
	case st.kind == 2 && len(v) == 2:
		ms, _ := v[1].(int64)
		st.left = time.Duration(ms) * time.Millisecond
		return st, nil
	}
	return st, fmt.Errorf("state probe: %v", v)
}
