package redis

import (
	"math"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/urlparam"
)

// ownParams are the URL parameters of this package (ttl is the Locker's,
// taken by driver.OptionsFromURL).
var ownParams = []string{"ttl", "prefix", "wait_replicas", "wait_timeout", "fence_retention", "eviction_check", "dial_timeout"}

// Limits of the go-redis parameters that are counts: go-redis takes any
// int, and panics or allocates without bound when it makes the client
// (pool_size=-5, 3000000000).
const (
	maxConns  = 1 << 16 // connections in a pool, concurrent dials
	maxBuffer = 1 << 26 // bytes of a pipeline buffer (64 MiB)
)

// goredisInts are the go-redis URL parameters that are whole numbers, with
// the values accepted. 0 means go-redis's default; -1 turns retries off
// (max_retries) or the pipeline pool off (pipeline_pool_size).
var goredisInts = map[string][2]int64{
	"protocol":                   {2, 3},
	"max_retries":                {-1, math.MaxInt32},
	"pool_size":                  {0, maxConns},
	"min_idle_conns":             {0, maxConns},
	"max_idle_conns":             {0, maxConns},
	"max_active_conns":           {0, maxConns},
	"max_concurrent_dials":       {0, maxConns},
	"pipeline_pool_size":         {-1, maxConns},
	"pipeline_read_buffer_size":  {0, maxBuffer},
	"pipeline_write_buffer_size": {0, maxBuffer},
	"db":                         {0, math.MaxInt32},
}

// goredisDurations are the go-redis URL parameters that are durations (a Go
// duration, or a whole number of seconds; 0 or less turns the timeout off).
var goredisDurations = []string{
	"min_retry_backoff", "max_retry_backoff", "read_timeout", "write_timeout", "pool_timeout",
	"conn_max_idle_time", "idle_timeout", "conn_max_lifetime", "max_conn_age", "conn_max_lifetime_jitter",
}

// goredisOthers are the remaining go-redis URL parameters: a string and
// booleans (skip_verify for rediss only).
var goredisOthers = []string{"client_name", "pool_fifo", "skip_verify"}

// knownParams lists every parameter a redis or rediss URL accepts, for the
// error about an unknown one.
func knownParams(tls bool) []string {
	k := slices.Clone(ownParams)
	for name := range goredisInts {
		k = append(k, name)
	}
	k = append(k, goredisDurations...)
	for _, name := range goredisOthers {
		if name != "skip_verify" || tls {
			k = append(k, name)
		}
	}
	if tls {
		k = append(k, tlsParamNames...)
	}
	return k
}

// checkGoredisParams checks the parameters left in q, which go to go-redis
// unchanged: each known, given once, and of a value go-redis copes with.
// It does not change q. Errors wrap backend.ErrInvalidConfig.
func checkGoredisParams(q url.Values, tls bool) error {
	c := url.Values{}
	for k, v := range q {
		c[k] = v
	}
	for name, r := range goredisInts {
		if _, _, err := urlparam.Int(c, name, r[0], r[1]); err != nil {
			return err
		}
	}
	for _, name := range goredisDurations {
		v, ok, err := urlparam.Take(c, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(v); err == nil {
			continue
		}
		if _, err := time.ParseDuration(v); err != nil {
			return badParam(name, v, "want a duration such as 3s, or a number of seconds")
		}
	}
	for _, name := range goredisOthers {
		if name == "skip_verify" && !tls {
			continue // an unknown parameter of redis://
		}
		v, ok, err := urlparam.Take(c, name)
		if err != nil {
			return err
		}
		if ok && name != "client_name" && v != "true" && v != "false" && v != "1" && v != "0" {
			return badParam(name, v, "want true or false")
		}
	}
	return urlparam.NoneLeft(c, knownParams(tls)...)
}

func badParam(name, v, want string) error {
	return urlparam.Invalid("parameter %s=%q: %s", name, v, want)
}
