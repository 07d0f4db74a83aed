package dlock

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// Purpose says what a lock is for. Opening a Locker for a purpose its
// backend cannot deliver fails (see [Open] and [Config.Open]), so that
// choosing a backend stays a configuration change that cannot silently
// weaken a lock that protects data.
type Purpose string

const (
	// Efficiency: the lock saves duplicate work; a rare second holder
	// costs only time. Every backend serves it.
	Efficiency Purpose = "efficiency"
	// Correctness: two holders at once would corrupt data. Only backends
	// whose tokens are consensus-grade and whose safety does not rest on
	// clocks serve it (etcd, ZooKeeper; and the in-process backend, within
	// one process). The protected resource must still check the token.
	Correctness Purpose = "correctness"
)

// check returns nil if a backend with guarantees g serves p, else an error
// wrapping ErrInvalidConfig that says why and what to use instead.
func (p Purpose) check(g Guarantees) error {
	switch p {
	case Efficiency:
		return nil
	case Correctness:
		var why []string
		if g.Fencing != FencingConsensus {
			why = append(why, fmt.Sprintf("its fencing tokens are %v, not consensus-grade", g.Fencing))
		}
		if g.ClockDependent {
			why = append(why, "its mutual exclusion rests on clocks, pauses and network delays staying bounded")
		}
		if len(why) == 0 {
			return nil
		}
		msg := why[0]
		if len(why) == 2 {
			msg += ", and " + why[1]
		}
		return fmt.Errorf("%w: this backend cannot serve purpose %q: %s (%s). Use etcd or ZooKeeper for locks that protect data; "+
			"to accept the risk anyway, add the parameter %s=true",
			ErrInvalidConfig, p, msg, g.Notes, unsafeOverrideParam)
	}
	return fmt.Errorf("%w: unknown purpose %q (want %q or %q)", ErrInvalidConfig, string(p), Efficiency, Correctness)
}

// unsafeOverrideParam is the URL parameter that lets a Locker be opened for
// correctness on a backend that cannot serve it. It is named so that no one
// sets it by accident, and the mux logs a warning when it is used.
const unsafeOverrideParam = "unsafe_accept_clock_dependent_lock"

// Config is an application's lock configuration, one URL per purpose, as
// loaded from a file (it has JSON tags) or from the environment. Code asks
// for a purpose; the configuration says which
// backend serves it, so swapping Redis for etcd is a change of
// configuration, not of code:
//
//	{
//	  "efficiency":  "redis://cache:6379?ttl=10s",
//	  "correctness": "etcd://etcd1:2379,etcd2:2379,etcd3:2379/locks?ttl=15s"
//	}
type Config struct {
	// Efficiency is the URL of the Locker for locks that save duplicate
	// work.
	Efficiency string `json:"efficiency"`
	// Correctness is the URL of the Locker for locks that protect data.
	// Opening it fails unless the backend serves correctness.
	Correctness string `json:"correctness"`
}

// Open opens the Locker for purpose p: the URL configured for it, opened
// as [Open] opens it with purpose=p, so that a backend that cannot serve p
// is refused. A purpose without a URL is an error wrapping
// ErrInvalidConfig, which names the field.
func (c Config) Open(ctx context.Context, p Purpose) (*Locker, error) {
	var raw, field string
	switch p {
	case Efficiency:
		raw, field = c.Efficiency, "Efficiency"
	case Correctness:
		raw, field = c.Correctness, "Correctness"
	default:
		return nil, opErr("open", "", fmt.Errorf("%w: unknown purpose %q (want %q or %q)", ErrInvalidConfig, string(p), Efficiency, Correctness))
	}
	if raw == "" {
		return nil, opErr("open", "", fmt.Errorf("%w: no URL configured for purpose %q (Config.%s is empty)",
			ErrInvalidConfig, p, field))
	}
	mux := defaultMux
	u, err := url.Parse(raw)
	if err != nil || atAfterHost(u, raw) {
		return mux.Open(ctx, raw) // which reports the bad URL without its password
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, opErr("open", "", fmt.Errorf("%w: query of %s: %w", ErrInvalidConfig, u.Redacted(), err))
	}
	if v, ok := q["purpose"]; ok && (len(v) != 1 || v[0] != string(p)) {
		return nil, opErr("open", "", fmt.Errorf("%w: the URL configured for purpose %q says purpose=%s", ErrInvalidConfig, p, strings.Join(v, ",")))
	}
	q.Set("purpose", string(p))
	u.RawQuery = q.Encode()
	return mux.OpenURL(ctx, u)
}
