// Package redisscript holds the Lua scripts of the Redis lock, shared by
// the redis (one server) and redlock (N independent masters) backends: one
// .lua file per script, with its KEYS/ARGV in a header comment, loaded once
// and run by EVALSHA.
package redisscript

import (
	_ "embed"

	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed refreshmany.lua
	refreshManySrc string
	//go:embed raise.lua
	raiseSrc string
	//go:embed below.lua
	belowSrc string // the exact counter comparison raise, release and refresh call
)

// The scripts (see each .lua file for KEYS, ARGV and the reply).
var (
	// Acquire takes a free lock and issues a fencing token (acquire.lua).
	Acquire = goredis.NewScript(acquireSrc)
	// Release deletes the lock if it is ours, and with a counter key raises
	// the counter to a token first (release.lua).
	Release = goredis.NewScript(belowSrc + releaseSrc)
	// Refresh extends the lock's TTL if it is ours, and with a counter key
	// raises the counter to a token first (refresh.lua).
	Refresh = goredis.NewScript(belowSrc + refreshSrc)
	// Raise raises a fencing counter to at least a value, exactly (raise.lua).
	Raise = goredis.NewScript(belowSrc + raiseSrc)
	// RefreshMany extends many locks' TTLs, each if it is ours, in one
	// script (refreshmany.lua; one hash slot on a Cluster). Not in All:
	// the redlock backend does not use it.
	RefreshMany = goredis.NewScript(refreshManySrc)
)

// All lists the scripts, for loading them.
var All = []*goredis.Script{Acquire, Release, Refresh, Raise}

// FenceSuffix and ReleaseSuffix follow a lock key (which ends with a hash
// tag's closing brace, so they share its Cluster slot): the fencing
// counter's key and the release channel.
const (
	FenceSuffix   = ":fence"
	ReleaseSuffix = ":released" // also spelled out in release.lua
)
