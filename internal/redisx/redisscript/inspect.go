package redisscript

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// ValueBound is the most bytes [Inspect] reads of a lock value or a fencing
// counter. The backends write values of at most ValueBound bytes (a holder
// description of up to backend.MaxHolderLen bytes, the OwnerLen hex digits
// of the ownership part, and the waited-for mark; see [NewValue]) and
// 20-digit counters; a longer value was put there by someone else, and
// reading all of it (a value can be 512 MB) would cost the inspecting
// process that much memory, on every node for Redlock.
const ValueBound = backend.MaxHolderLen + OwnerLen + 1

// MaxInspectHolders is the most shared holders [InspectShared] reads of
// one key: the first ones of its holders' sorted set (by expiry).
const MaxInspectHolders = 1000

// Snapshot is what [Inspect] reads of one lock on one server.
type Snapshot struct {
	// Held: the lock key exists.
	Held bool
	// Value is the lock value (the holder description and the ownership
	// part, see [NewValue]), without the waited-for mark ('+', see
	// acquire.lua); for a Foreign value, its first ValueBound bytes.
	Value string
	// Holder is the holder description in Value ([HolderOf]): "" when
	// the grant gave none, and for a value that no grant of the backends
	// wrote (Foreign, too short, not ending with the ownership part).
	Holder string
	// Foreign: the value is longer than ValueBound bytes, so no grant of
	// the backends wrote it (Value and Waited are then not meaningful).
	Foreign bool
	// Waited: a waiter has marked the lock (acquire.lua appends '+').
	Waited bool
	// PTTL is the time left on the lock key, 0 if it has no expiry.
	PTTL time.Duration
	// Counter is the fencing counter, 0 if it is missing or not a
	// decimal number.
	Counter uint64
}

// Inspect reads the lock key lk and its fencing counter (lk + FenceSuffix)
// in one MULTI/EXEC (both are in one hash slot), writing nothing. It reads
// at most ValueBound bytes of each value (GETRANGE, with STRLEN for the
// value's length).
func Inspect(ctx context.Context, c goredis.Cmdable, lk string) (Snapshot, error) {
	var get, ctr *goredis.StringCmd
	var size *goredis.IntCmd
	var pttl *goredis.DurationCmd
	_, err := c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		pttl = p.PTTL(ctx, lk)
		get = p.GetRange(ctx, lk, 0, ValueBound-1)
		size = p.StrLen(ctx, lk)
		ctr = p.GetRange(ctx, lk+FenceSuffix, 0, ValueBound-1)
		return nil
	})
	if err != nil {
		return Snapshot{}, err
	}
	var s Snapshot
	// PTTL is -2 for a missing key, -1 for one without expiry (go-redis
	// keeps both as they are).
	d := pttl.Val()
	if d == -2 {
		return s, nil
	}
	s.Held = true
	if d > 0 {
		s.PTTL = d
	}
	v := get.Val()
	if s.Foreign = size.Val() > ValueBound; s.Foreign {
		s.Value = v
	} else {
		s.Value, s.Waited = strings.CutSuffix(v, "+")
		s.Holder = HolderOf(s.Value)
	}
	// A missing counter reads as "" (GETRANGE), a foreign one as its
	// first ValueBound bytes: neither parses.
	s.Counter = CounterOf(ctr.Val())
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

// SharedHolder is one valid shared lease that [InspectShared] read.
type SharedHolder struct {
	// Token is the lease's fencing token (0 if its record is missing).
	Token uint64
	// TTL is the time left on the lease, as the server counts it.
	TTL time.Duration
	// Holder is the holder description in the lease's value ([HolderOf]).
	Holder string
}

// SharedSnapshot is what [InspectShared] reads of one lock: the lock key
// as [Inspect] reads it and, when the key is held by shared leases or
// reserved for writers (see shared.lua), what its value says and its
// valid leases. Held then reports that one of them is valid (a
// reservation has none).
type SharedSnapshot struct {
	Snapshot
	// Shared: the lock value is one of shared leases (Kind tells which);
	// Holders lists the valid ones, oldest grant first (by token).
	Shared  bool
	Kind    SharedValue
	Holders []SharedHolder
}

//go:embed inspect.lua
var inspectSrc string

// inspectScript reads a lock for InspectShared (inspect.lua).
var inspectScript = goredis.NewScript(inspectSrc)

// InspectShared reads what Inspect reads and the server clock, the
// holders and the tokens of lk (the single-Redis backend's shared leases:
// lk + HoldersSuffix and lk + TokensSuffix, in lk's slot), writing
// nothing, in one script (inspect.lua: EVALSHA, or EVAL where the server
// does not have it yet): atomic as a MULTI/EXEC would be, without the
// rights to MULTI and EXEC. The clock, holders and tokens are read only
// for a lock value of shared holders or a reservation, and bounded as
// the lock value is: at most [MaxInspectHolders] holders, each value and
// token cut to [ValueBound] bytes, so that keys someone else made large
// cost the inspecting process no more than that.
func InspectShared(ctx context.Context, c goredis.Scripter, lk string) (SharedSnapshot, error) {
	var s SharedSnapshot
	r, err := inspectScript.Run(ctx, c, []string{lk, lk + FenceSuffix, lk + HoldersSuffix, lk + TokensSuffix}, ValueBound, MaxInspectHolders).Slice()
	if err != nil {
		return s, err
	}
	bad := func() (SharedSnapshot, error) {
		return SharedSnapshot{}, fmt.Errorf("redisscript: unexpected reply from the inspect script: %v", r)
	}
	if len(r) == 1 {
		if n, _ := r[0].(int64); n == -2 {
			return s, nil
		}
		return bad()
	}
	if len(r) != 4 && len(r) != 8 {
		return bad()
	}
	d, ok1 := r[0].(int64)
	v, ok2 := r[1].(string)
	size, ok3 := r[2].(int64)
	ctr, ok4 := r[3].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return bad()
	}
	s.Held = true
	if d > 0 {
		s.PTTL = time.Duration(d) * time.Millisecond
	}
	if s.Foreign = size > ValueBound; s.Foreign {
		s.Value = v
		return s, nil
	}
	s.Value, s.Waited = strings.CutSuffix(v, "+")
	if s.Kind, s.Shared = ParseShared(s.Value); !s.Shared {
		s.Holder = HolderOf(s.Value)
		s.Counter = CounterOf(ctr)
		return s, nil
	}
	if len(r) != 8 {
		return bad()
	}
	sec, ok1 := r[4].(string)
	usec, ok2 := r[5].(string)
	members, ok3 := r[6].([]any)
	tokens, ok4 := r[7].([]any)
	secs, err1 := strconv.ParseInt(sec, 10, 64)
	usecs, err2 := strconv.ParseInt(usec, 10, 64)
	if !ok1 || !ok2 || !ok3 || !ok4 || err1 != nil || err2 != nil || len(members)%2 != 0 || len(tokens) != len(members)/2 {
		return bad()
	}
	nowMs := secs*1000 + usecs/1000
	for i := 0; i+1 < len(members); i += 2 {
		value, _ := members[i].(string)
		sc, _ := members[i+1].(string)
		f, err := strconv.ParseFloat(sc, 64)
		if err != nil {
			return bad()
		}
		score := int64(f)
		if score <= nowMs {
			continue // expired, not pruned yet
		}
		t, _ := tokens[i/2].(string)
		tok, _ := strconv.ParseUint(t, 10, 64)
		s.Holders = append(s.Holders, SharedHolder{Token: tok, TTL: time.Duration(score-nowMs) * time.Millisecond, Holder: HolderOf(value)})
	}
	slices.SortStableFunc(s.Holders, func(a, b SharedHolder) int { return cmp.Compare(a.Token, b.Token) })
	s.Held = len(s.Holders) > 0
	return s, nil
}

// CounterOf reads a fencing counter's value (a prefix of it will do): its
// number, which tombstones may follow (cut.lua); 0 for a missing counter
// ("") and one that is not a decimal number.
func CounterOf(v string) uint64 {
	if i := strings.IndexByte(v, '!'); i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.ParseUint(v, 10, 64)
	return n
}
