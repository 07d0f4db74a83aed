package redis

import (
	"context"
	_ "embed"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/fencecheck"
)

//go:embed fencestore_set.lua
var fenceSetSrc string

var fenceSetScript = goredis.NewScript(fenceSetSrc)

// FenceTokenSuffix follows a data key to name the key where [FenceStore]
// keeps the highest token written to it.
const FenceTokenSuffix = ":fence-token"

// FenceStore fences writes to Redis string values (a fence.Store): the
// token is checked and the value set in one Lua script, next to the data.
// It needs no lock of this package: any backend's token will do. The
// highest token for key is kept at key + FenceTokenSuffix; on Redis Cluster, give key a hash tag
// ("{orders}:42") so that both land in one slot. The stored token is as
// durable as Redis is: a failover to a replica that missed it forgets it.
type FenceStore struct {
	Client goredis.UniversalClient
}

// Set stores value under key if token is at least the highest token a
// write to key has carried (equal tokens pass), and records token, in one
// script; see fence.Store for the errors. A *goredis.Ring is refused.
func (r FenceStore) Set(ctx context.Context, key, value string, token dlock.Token) error {
	if err := fencecheck.Set("redis", key, uint64(token), r.Client == nil); err != nil {
		return err
	}
	switch r.Client.(type) {
	case *goredis.Ring:
		// A Ring moves keys to another shard when one looks unhealthy:
		// the highest token would be forgotten.
		return fmt.Errorf("%w: fence: redis: a *goredis.Ring can lose the stored token; use a Client or ClusterClient", backend.ErrInvalidConfig)
	}
	res, err := fenceSetScript.Run(ctx, r.Client, []string{key, key + FenceTokenSuffix}, value, fencecheck.Padded(uint64(token))).Text()
	if err != nil {
		return fmt.Errorf("%w: fence: redis: %w", backend.ErrUnavailable, err)
	}
	if res != "OK" {
		return &fence.StaleError{Resource: key, Token: token, Highest: dlock.Token(fencecheck.Unpad(res))}
	}
	return nil
}
