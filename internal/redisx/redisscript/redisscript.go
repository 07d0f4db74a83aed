// Package redisscript holds the Lua scripts of the Redis lock, shared by
// the redis (one server) and redlock (N independent masters) backends: one
// .lua file per script, with its KEYS/ARGV in a header comment, loaded once
// and run by EVALSHA.
package redisscript

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
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
	//go:embed probe.lua
	probeSrc string
	//go:embed issue.lua
	issueSrc string // the token issue acquire and acquireshared call
	//go:embed cut.lua
	cutSrc string // the tombstones of acquires given up, which issue, forsake and forsakeshared call
	//go:embed forsake.lua
	forsakeSrc string
	//go:embed forsakeshared.lua
	forsakeSharedSrc string
	//go:embed shared.lua
	sharedSrc string // the shared-lease layout and helpers the *shared scripts call
	//go:embed acquireshared.lua
	acquireSharedSrc string
	//go:embed releaseshared.lua
	releaseSharedSrc string
	//go:embed refreshshared.lua
	refreshSharedSrc string
	//go:embed refreshmanyshared.lua
	refreshManySharedSrc string
)

// The scripts (see each .lua file for KEYS, ARGV and the reply).
var (
	// Acquire takes a free lock and issues a fencing token (acquire.lua),
	// unless a tombstone of its value refuses it (cut.lua).
	Acquire = goredis.NewScript(cutSrc + issueSrc + acquireSrc)
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
	// Probe tries every command the other scripts call on a probe key,
	// for CheckRights (probe.lua). Not in All: it is sent with EVAL, once.
	Probe = goredis.NewScript(probeSrc)

	// The shared-lease scripts of the single-Redis backend (semaphore
	// permits and readers' leases; the layout is in shared.lua). Not in
	// All: the redlock backend serves no shared leases.

	// AcquireShared takes a shared lease if the key allows one and issues
	// a fencing token from the counter exclusive grants use
	// (acquireshared.lua).
	AcquireShared = goredis.NewScript(cutSrc + issueSrc + sharedSrc + acquireSharedSrc)
	// ReleaseShared ends a shared lease if it is valid (releaseshared.lua).
	ReleaseShared = goredis.NewScript(sharedSrc + releaseSharedSrc)
	// RefreshShared extends a shared lease if it is valid
	// (refreshshared.lua).
	RefreshShared = goredis.NewScript(sharedSrc + refreshSharedSrc)
	// RefreshManyShared extends many shared leases, each if it is valid,
	// in one script (refreshmanyshared.lua; single primary only).
	RefreshManyShared = goredis.NewScript(sharedSrc + refreshManySharedSrc)

	// The clean-ups of the single-Redis backend's acquires given up by
	// their callers (see cut.lua). Not in All either.

	// Forsake deletes the lock an exclusive acquire took, if it did, and
	// leaves a tombstone that refuses the acquire if it has not arrived
	// yet (forsake.lua).
	Forsake = goredis.NewScript(cutSrc + forsakeSrc)
	// ForsakeShared is Forsake for a shared acquire (forsakeshared.lua).
	ForsakeShared = goredis.NewScript(cutSrc + sharedSrc + forsakeSharedSrc)
)

// All lists the scripts, for loading them.
var All = []*goredis.Script{Acquire, Release, Refresh, Raise}

// FenceSuffix and ReleaseSuffix follow a lock key (which ends with a hash
// tag's closing brace, so they share its Cluster slot): the fencing
// counter's key and the release channel.
const (
	FenceSuffix   = ":fence"
	ReleaseSuffix = ":released" // also spelled out in release.lua and releaseshared.lua
)

// HoldersSuffix and TokensSuffix follow a lock key held by shared leases
// (the single-Redis backend; see shared.lua): the sorted set of its
// holders, scored by their expiry, and the hash of their tokens.
const (
	HoldersSuffix = ":holders"
	TokensSuffix  = ":tokens"
)

// PermitsReply begins the error reply of acquireshared.lua for a request
// whose permits differ from those of the key's holders; theirs follow it.
const PermitsReply = "DLOCKPERMITS "

// HeldPermits reports whether err is acquireshared.lua's PermitsReply, and
// the permits of the key's holders it names.
func HeldPermits(err error) (int, bool) {
	var re goredis.Error
	if !errors.As(err, &re) {
		return 0, false
	}
	rest, ok := strings.CutPrefix(re.Error(), PermitsReply)
	if !ok {
		return 0, false
	}
	n, perr := strconv.Atoi(rest)
	if perr != nil {
		return 0, false
	}
	return n, true
}

// ReleasedUnannounced is the release script's reply when it deleted the
// lock but could not publish the release (release.lua): the lock is
// released, and its waiters learn it when they next poll.
const ReleasedUnannounced = 2

// Refusal is a right the server refused the connected user (an ACL
// refusal), found by CheckRights or a backend's own check.
type Refusal struct {
	Command string // the command refused, lower case: "evalsha", "publish", "script|load"
	Kind    string // what the user lacks the right to: "command", "key" or "channel"
	Name    string // the key or channel (Kind "key" or "channel")
	Reply   string // the server's error
}

// IsRefusal reports whether err is an error reply of the server refusing
// a command for want of a right: NOPERM, or an ACL failure inside a
// script (Redis 7 and 8 report those as ERR).
func IsRefusal(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	m := strings.ToLower(re.Error())
	return strings.HasPrefix(m, "noperm") || strings.Contains(m, "no permissions") ||
		strings.Contains(m, "acl failure") || strings.Contains(m, "can't run this command")
}

// AsRefusal returns the refusal err reports, if it is one (IsRefusal), of
// cmd (lower case) on the key or channel name.
func AsRefusal(cmd, name string, err error) (Refusal, bool) {
	if !IsRefusal(err) {
		return Refusal{}, false
	}
	return refusal(cmd, name, err.Error()), true
}

// refusal reads reply, the server's refusal of cmd on name.
func refusal(cmd, name, reply string) Refusal {
	r := Refusal{Command: cmd, Kind: "command", Reply: reply}
	m := strings.ToLower(reply)
	switch {
	case strings.Contains(m, "channel"):
		r.Kind, r.Name = "channel", name
	case strings.Contains(m, "key"):
		r.Kind, r.Name = "key", name
	default:
		// "... no permissions to run the 'eval' command": the command
		// named is the one refused (a script's EVAL, say).
		if _, after, ok := strings.Cut(reply, " the '"); ok {
			if c, _, ok := strings.Cut(after, "'"); ok && c != "" {
				r.Command = strings.ToLower(c)
			}
		}
	}
	return r
}

// String describes r: what the user may not do, and the server's reply.
func (r Refusal) String() string {
	switch r.Kind {
	case "channel":
		return fmt.Sprintf("may not publish or subscribe to channel %q (%s: %s)", r.Name, strings.ToUpper(r.Command), r.Reply)
	case "key":
		return fmt.Sprintf("may not read or write key %q (%s: %s)", r.Name, strings.ToUpper(r.Command), r.Reply)
	}
	return fmt.Sprintf("may not run %s (%s)", strings.ToUpper(r.Command), r.Reply)
}

// Grant returns the ACL SETUSER rule that grants r to a user whose locks
// are under prefix: "+publish", "~dlock:*" or "&dlock:*".
func (r Refusal) Grant(prefix string) string {
	switch r.Kind {
	case "channel":
		return "&" + prefix + "*"
	case "key":
		return "~" + prefix + "*"
	}
	return "+" + r.Command
}

// RightsError is the error of a backend that found refused (not empty)
// when it was opened: it wraps backend.ErrInvalidConfig and names each
// right and the ACL SETUSER command that grants them all. name is the
// backend's ("redis", "redlock"), where says where after the user (""
// or " on node 1 (h:6379)").
func RightsError(name, where, user, prefix string, refused []Refusal) error {
	var descs, grants []string
	for _, r := range refused {
		descs = append(descs, r.String())
		if g := r.Grant(prefix); !slices.Contains(grants, g) {
			grants = append(grants, g)
		}
	}
	it := "it"
	if len(grants) > 1 {
		it = "them"
	}
	return fmt.Errorf("%w: %s: user %q%s %s: grant %s with ACL SETUSER %s %s (see the package documentation, Permissions)",
		backend.ErrInvalidConfig, name, user, where, strings.Join(descs, "; "), it, user, strings.Join(grants, " "))
}

// User returns the name of the ACL user that client authenticates as, for
// errors: its Username, "default" when it has none (and no credentials
// provider, which may name one), else "<user>".
func User(client goredis.UniversalClient) string {
	var (
		user     string
		provided bool
	)
	switch c := client.(type) {
	case interface{ Options() *goredis.Options }:
		o := c.Options()
		user, provided = o.Username, o.CredentialsProvider != nil || o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil
	case interface {
		Options() *goredis.ClusterOptions
	}:
		o := c.Options()
		user, provided = o.Username, o.CredentialsProvider != nil || o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil
	default:
		provided = true
	}
	switch {
	case user != "":
		return user
	case provided:
		return "<user>"
	}
	return "default"
}

// CheckRights checks, on c, that the user may run what the lock scripts
// run, on the probe lock key lk (under the prefix; no lock uses it), its
// counter key and its release channel: in one pipeline, an EVALSHA of
// Release on lk (with a value no lock has: it changes nothing; NOSCRIPT
// counts as allowed), an EVAL of Probe (every command the scripts call;
// probe.lua), and the caller's extra commands (WAIT 0 1, say). It returns
// the refusals it found, and err, the first failure that is not a refusal:
// a network error (nothing could be checked), or another error reply (a
// proxy or an old server that cannot run the probe: the check is
// incomplete, and the caller should not fail for it alone). On a Cluster,
// every command of the pipeline but the extras goes to lk's slot.
func CheckRights(ctx context.Context, c goredis.Cmdable, lk string, extra ...[]any) (refused []Refusal, err error) {
	return checkRights(ctx, c, lk, false, extra)
}

// CheckRightsShared is CheckRights for a backend that serves shared
// leases (the single-Redis backend): the probe also tries the commands of
// the shared-lease scripts, on lk's holders and tokens keys (probe.lua).
func CheckRightsShared(ctx context.Context, c goredis.Cmdable, lk string, extra ...[]any) (refused []Refusal, err error) {
	return checkRights(ctx, c, lk, true, extra)
}

func checkRights(ctx context.Context, c goredis.Cmdable, lk string, shared bool, extra [][]any) (refused []Refusal, err error) {
	keys := []string{lk, lk + FenceSuffix}
	var args []any
	if shared {
		keys = append(keys, lk+HoldersSuffix, lk+TokensSuffix)
		args = []any{"shared"}
	}
	pipe := c.Pipeline()
	sha := Release.EvalSha(ctx, pipe, keys[:1], "")
	ev := Probe.Eval(ctx, pipe, keys, args...)
	var extras []*goredis.Cmd
	for _, e := range extra {
		extras = append(extras, pipe.Do(ctx, e...))
	}
	_, _ = pipe.Exec(ctx) // the errors are in the commands
	note := func(cmd, name string, e error) {
		switch {
		case e == nil:
		case IsRefusal(e):
			r, _ := AsRefusal(cmd, name, e)
			refused = append(refused, r)
		case err == nil:
			err = fmt.Errorf("%s: %w", strings.ToUpper(cmd), e)
		}
	}
	if e := sha.Err(); !goredis.HasErrorPrefix(e, "NOSCRIPT") {
		note("evalsha", lk, e)
	}
	v, e := ev.Result()
	note("eval", lk, e)
	if e == nil {
		out, ok := v.([]any)
		if !ok || len(out)%3 != 0 {
			note("eval", lk, fmt.Errorf("redisscript: unexpected reply from the probe script: %v", v))
		}
		for i := 0; ok && i+2 < len(out); i += 3 {
			cmd, _ := out[i].(string)
			name, _ := out[i+1].(string)
			reply, _ := out[i+2].(string)
			note(cmd, name, scriptError(reply))
		}
	}
	for i, x := range extras {
		note(strings.ToLower(fmt.Sprint(extra[i][0])), "", x.Err())
	}
	return refused, err
}

// scriptError is an error a call in the probe script returned: an error
// reply of the server (goredis.Error), as it would be outside a script.
type scriptError string

func (e scriptError) Error() string { return string(e) }

// RedisError marks scriptError as a goredis.Error.
func (scriptError) RedisError() {}
