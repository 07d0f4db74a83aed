package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

func init() {
	register(&command{name: "inspect", short: "show who holds a lock (read-only)", run: inspectCmd})
}

// inspectDefaultTimeout bounds dlock inspect's open and read.
const inspectDefaultTimeout = 10 * time.Second

const inspectUsage = `usage: dlock inspect [flags] [URL] KEY

Inspect shows who holds the lock KEY: the holder's fencing token, the
holder's description, the time left on its lease, and how many wait for
it, where the backend can tell (dlock.Locker.Inspect). It changes nothing:
no lease is taken, refreshed or released. For example:

	KEY orders/42 held by token 1234, holder web-3/4242, 12.3s left, 2 waiters
	KEY orders/42 free

A semaphore's key (dlock run --permits) shows its permits in use, of how
many, and each holder, oldest first; a read-write lock's readers (dlock run
--shared) show each reader:

	KEY imports held by 2 of 4 permits: token 17, holder web-3/4242, 12.3s left; token 19, holder web-4/77, 14.0s left
	KEY config held by 1 reader: token 20, holder web-3/4243, 9.8s left

The holder is the description the holder acquired the lock with
(dlock.AcquireOptions.Holder): dlock run's --holder, by default its
hostname/pid. A lock taken without one shows none. The key and the holder
are printed in double quotes, with Go escapes, when they hold a space, a
double quote or a character that is not printable.

What each backend can tell: etcd all three (the token is the holder's
create revision, the time left its etcd lease's, in whole seconds);
ZooKeeper the token (czxid) and the waiters, not the time left (a lock
node lasts as long as its holder's session); Redis the token and the time
left, not the waiters (Redis keeps no queue); Redlock the time left (the
least among the majority that holds it), neither token nor waiters.

The output is a snapshot, stale as soon as it is printed: never use it to
decide whether to touch the protected resource; acquire the lock instead.

The URL may be given as the first argument, as with --url.
` + backendHelp + `

Exit status: 0 (held or free), 1 on failure, 2 for a usage error.

Flags:
`

// inspectJSON is dlock inspect --json's output. Unknown values are null.
type inspectJSON struct {
	Key     string       `json:"key"`
	Held    bool         `json:"held"`
	Token   *dlock.Token `json:"token"`
	Holder  *string      `json:"holder"`
	TTL     *float64     `json:"ttl_seconds"`
	Waiters *int         `json:"waiters"`
	// Shared leases: whether the holders hold them, the semaphore's
	// permits (null for readers and exclusive holders), and every holder.
	Shared  bool          `json:"shared"`
	Permits *int          `json:"permits"`
	Holders []holdingJSON `json:"holders"`
}

// holdingJSON is one holder in inspectJSON.Holders. Unknown values are
// null.
type holdingJSON struct {
	Token  *dlock.Token `json:"token"`
	Holder *string      `json:"holder"`
	TTL    *float64     `json:"ttl_seconds"`
}

// inspectCmd is dlock inspect.
func inspectCmd(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet("inspect", inspectUsage)
	rawURL, purpose := backendFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object: key, held, token, holder, ttl_seconds, waiters, shared, permits,\n"+
		"holders (each with token, holder, ttl_seconds; null when unknown)")
	timeout := fs.Duration("timeout", inspectDefaultTimeout, "give up after this `duration` (opening the backend and reading)")
	if status, ok := parseFlags(e, "inspect", fs, args); !ok {
		return status
	}
	usageErr := func(format string, a ...any) int { return usageFail(e, "inspect", format, a...) }
	var key string
	switch rest := fs.Args(); len(rest) {
	case 0:
		return usageErr("missing KEY")
	case 1:
		key = rest[0]
	case 2:
		if *rawURL != "" {
			return usageErr("a URL both in --url and as an argument")
		}
		*rawURL, key = rest[0], rest[1]
	default:
		return usageErr("too many arguments: want [URL] KEY (flags go first)")
	}
	if err := backend.ValidateKey(key); err != nil {
		return usageErr("%s", keyErr(key, err))
	}
	if *timeout <= 0 {
		return usageErr("--timeout %v: want a positive duration", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	l, err := openLocker(ctx, e, *rawURL, *purpose)
	if err != nil {
		if isUsage(err) {
			return usageErr("%v", err)
		}
		fmt.Fprintf(e.stderr, "dlock inspect: %s\n", printable(err.Error()))
		return exitFailure
	}
	defer l.Close()
	info, err := l.Inspect(ctx, key)
	if err != nil {
		if errors.Is(err, dlock.ErrInvalidKey) {
			return usageErr("%v", err)
		}
		fmt.Fprintf(e.stderr, "dlock inspect: %s\n", printable(err.Error()))
		return exitFailure
	}
	if *asJSON {
		b, _ := json.Marshal(toJSON(key, info)) // cannot fail
		fmt.Fprintf(e.stdout, "%s\n", b)
		return exitOK
	}
	fmt.Fprintln(e.stdout, describe(key, info))
	return exitOK
}

// toJSON is dlock inspect --json's object for info, read on key: what the
// backend cannot tell (and a holder that gave no description) is null.
func toJSON(key string, info dlock.LockInfo) inspectJSON {
	top := holdingToJSON(backend.Holding{Token: info.Token, Holder: info.Holder, TTL: info.TTL})
	out := inspectJSON{Key: key, Held: info.Held, Token: top.Token, Holder: top.Holder, TTL: top.TTL, Shared: info.Shared, Holders: []holdingJSON{}}
	if info.Waiters >= 0 {
		out.Waiters = &info.Waiters
	}
	if info.Permits > 0 {
		out.Permits = &info.Permits
	}
	for _, h := range holdings(info) {
		out.Holders = append(out.Holders, holdingToJSON(h))
	}
	return out
}

// holdings is info's holders, oldest first: LockInfo.Holders, or the one
// holder of the top-level fields from a backend that lists none.
func holdings(info dlock.LockInfo) []backend.Holding {
	if len(info.Holders) > 0 || !info.Held {
		return info.Holders
	}
	return []backend.Holding{{Token: info.Token, TTL: info.TTL, Holder: info.Holder}}
}

// holdingToJSON is h with what the backend cannot tell as null.
func holdingToJSON(h backend.Holding) holdingJSON {
	var out holdingJSON
	if h.Token != 0 {
		out.Token = &h.Token
	}
	if h.Holder != "" {
		out.Holder = &h.Holder
	}
	if h.TTL > 0 {
		s := h.TTL.Seconds()
		out.TTL = &s
	}
	return out
}

// describe is dlock inspect's line: "KEY orders/42 held by token 1234,
// holder web-3/4242, 12.3s left, 2 waiters", or "KEY orders/42 free". What
// the backend cannot tell is left out, and so is a holder without a
// description.
func describe(key string, info dlock.LockInfo) string {
	var b strings.Builder
	b.WriteString("KEY ")
	b.WriteString(quoteIfNeeded(key))
	if !info.Held {
		b.WriteString(" free")
		return b.String()
	}
	if info.Shared {
		hs := holdings(info)
		switch {
		case info.Permits > 0:
			fmt.Fprintf(&b, " held by %d of %d permits: ", len(hs), info.Permits)
		case len(hs) == 1:
			b.WriteString(" held by 1 reader: ")
		default:
			fmt.Fprintf(&b, " held by %d readers: ", len(hs))
		}
		for i, h := range hs {
			if i > 0 {
				b.WriteString("; ")
			}
			writeHolding(&b, h)
		}
	} else {
		b.WriteString(" held")
		if info.Token != 0 {
			fmt.Fprintf(&b, " by token %d", info.Token)
		}
		if info.Holder != "" {
			fmt.Fprintf(&b, ", holder %s", quoteIfNeeded(info.Holder))
		}
		if info.TTL > 0 {
			fmt.Fprintf(&b, ", %v left", info.TTL.Round(100*time.Millisecond))
		}
	}
	switch info.Waiters {
	case -1:
	case 1:
		b.WriteString(", 1 waiter")
	default:
		fmt.Fprintf(&b, ", %d waiters", info.Waiters)
	}
	return b.String()
}

// writeHolding writes "token 1234, holder web-3/4242, 12.3s left", less
// what the backend cannot tell ("unknown" when it can tell nothing).
func writeHolding(b *strings.Builder, h backend.Holding) {
	var parts []string
	if h.Token != 0 {
		parts = append(parts, fmt.Sprintf("token %d", h.Token))
	}
	if h.Holder != "" {
		// Validated printable by the library, but read from a server
		// that anyone may have written to: quoted with escapes all the
		// same when it is not plainly printable.
		parts = append(parts, "holder "+quoteIfNeeded(h.Holder))
	}
	if h.TTL > 0 {
		parts = append(parts, fmt.Sprintf("%v left", h.TTL.Round(100*time.Millisecond)))
	}
	if len(parts) == 0 {
		parts = append(parts, "unknown")
	}
	b.WriteString(strings.Join(parts, ", "))
}

// quoteIfNeeded is s as dlock inspect prints a key or a holder: as it is,
// or double-quoted with Go escapes (strconv.Quote) if it is empty or holds
// a space, a double quote or a character that is not printable, so that
// it reads as one word and cannot move a terminal's cursor.
func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || !strconv.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}
