package fence

import (
	"context"
	_ "embed"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

//go:embed set.lua
var setSrc string

var setScript = goredis.NewScript(setSrc)

// TokenSuffix follows a data key to name the key where [Redis] keeps the
// highest token written to it.
const TokenSuffix = ":fence-token"

// Redis fences writes to Redis string values: the token is checked and the
// value set in one Lua script, next to the data. The highest token for key
// is kept at key + TokenSuffix; on Redis Cluster, give key a hash tag
// ("{orders}:42") so that both land in one slot. The stored token is as
// durable as Redis is: a failover to a replica that missed it forgets it.
type Redis struct {
	Client goredis.UniversalClient
}

// Set stores value under key if token is at least the highest token a
// write to key has carried (equal tokens pass), and records token, in one
// script; see [Store] for the errors. A *goredis.Ring is refused.
func (r Redis) Set(ctx context.Context, key, value string, token dlock.Token) error {
	if err := checkSet("redis", key, token, r.Client == nil); err != nil {
		return err
	}
	switch r.Client.(type) {
	case *goredis.Ring:
		// A Ring moves keys to another shard when one looks unhealthy:
		// the highest token would be forgotten.
		return fmt.Errorf("%w: fence: redis: a *goredis.Ring can lose the stored token; use a Client or ClusterClient", backend.ErrInvalidConfig)
	}
	res, err := setScript.Run(ctx, r.Client, []string{key, key + TokenSuffix}, value, padded(token)).Text()
	if err != nil {
		return fmt.Errorf("%w: fence: redis: %w", backend.ErrUnavailable, err)
	}
	if res != "OK" {
		return &StaleError{Resource: key, Token: token, Highest: unpad(res)}
	}
	return nil
}

// padded writes a token as 20 decimal digits, so that comparing the
// strings compares the numbers (Lua and etcd compare strings exactly; Lua
// numbers would lose precision above 2^53).
func padded(t dlock.Token) string { return fmt.Sprintf("%020d", uint64(t)) }

func unpad(s string) dlock.Token {
	var n uint64
	_, _ = fmt.Sscanf(s, "%d", &n)
	return dlock.Token(n)
}
