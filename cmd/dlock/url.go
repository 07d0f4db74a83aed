package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd"      // etcd://, etcds://
	_ "github.com/dlock-go/dlock/memory"    // mem://
	_ "github.com/dlock-go/dlock/redis"     // redis://, rediss://
	_ "github.com/dlock-go/dlock/redlock"   // redlock://, redlocks://
	_ "github.com/dlock-go/dlock/zookeeper" // zk://, zks://
)

// openTimeout bounds openLocker when its context has no deadline: with no
// server, the open fails by then and says why, instead of waiting.
const openTimeout = 10 * time.Second

// The environment variables that choose a backend (see openLocker).
const (
	envURL         = "DLOCK_URL"
	envCorrectness = "DLOCK_CORRECTNESS_URL"
	envEfficiency  = "DLOCK_EFFICIENCY_URL"
)

// usageError is an error in the command line (exit status 2), as opposed
// to a failure to open the backend.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// isUsage reports whether err is (or wraps) a usageError.
func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

// backendFlags defines --url and --purpose on fs, with the help text every
// subcommand shares; pass their values to openLocker.
func backendFlags(fs *flag.FlagSet) (rawURL, purpose *string) {
	rawURL = fs.String("url", "", "the backend's `URL`, as in dlock.Open (default $"+envURL+")")
	purpose = fs.String("purpose", "", "instead of --url, open the URL configured for `P`: correctness ($"+envCorrectness+")\n"+
		"or efficiency ($"+envEfficiency+"), refused if the backend cannot serve it")
	return rawURL, purpose
}

// backendHelp is a paragraph for a subcommand's usage: how the backend is
// chosen.
const backendHelp = `The backend is the URL given by --url, else $` + envURL + ` (such as
etcd://localhost:2379, redis://localhost:6379, zk://localhost:2181,
redlock://h1:6379,h2:6379,h3:6379; parameters as in dlock.Open, for
example ?ttl=15s). With --purpose correctness|efficiency it is the URL in
$` + envCorrectness + ` or $` + envEfficiency + ` (a dlock.Config),
opened for that purpose: a backend that cannot serve it is refused.`

// openLocker opens the backend a subcommand was told to use:
//
//   - purpose "correctness" or "efficiency": the URL of dlock.Config for
//     that purpose, read from DLOCK_CORRECTNESS_URL / DLOCK_EFFICIENCY_URL
//     through e.getenv, opened by dlock.Config.Open with that
//     purpose (a backend that cannot serve it is refused);
//   - else rawURL, else DLOCK_URL (through e.getenv), opened by
//     dlock.Open (a purpose=... parameter in the URL is honoured).
//
// Both rawURL and purpose, an unknown purpose, or no URL at all is a
// usageError (isUsage). Every backend package is imported, so every scheme
// dlock knows is served: etcd, etcds, redis, rediss, redlock, redlocks,
// zk, zks, mem (mem://
// is in-process: it excludes nothing between two dlock processes). If ctx has
// no deadline, the open is bounded by openTimeout. Errors name the URL
// without its password.
func openLocker(ctx context.Context, e *env, rawURL, purpose string) (*dlock.Locker, error) {
	if rawURL != "" && purpose != "" {
		return nil, &usageError{"--url and --purpose exclude each other"}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, openTimeout)
		defer cancel()
	}
	if purpose != "" {
		p := dlock.Purpose(purpose)
		var name string
		switch p {
		case dlock.Correctness:
			name = envCorrectness
		case dlock.Efficiency:
			name = envEfficiency
		default:
			return nil, &usageError{fmt.Sprintf("--purpose %q: want %q or %q", purpose, dlock.Correctness, dlock.Efficiency)}
		}
		c := dlock.Config{Efficiency: e.getenv(envEfficiency), Correctness: e.getenv(envCorrectness)}
		raw := e.getenv(name)
		if raw == "" {
			return nil, &usageError{fmt.Sprintf("--purpose %s: $%s is not set", purpose, name)}
		}
		l, err := c.Open(ctx, p)
		if err != nil {
			return nil, openErr(ctx, raw, err)
		}
		return l, nil
	}
	if rawURL == "" {
		rawURL = e.getenv(envURL)
	}
	if rawURL == "" {
		return nil, &usageError{"no backend: give --url URL, set $" + envURL + ", or use --purpose with $" + envCorrectness + " or $" + envEfficiency}
	}
	l, err := dlock.Open(ctx, rawURL)
	if err != nil {
		return nil, openErr(ctx, rawURL, err)
	}
	return l, nil
}

// openErr says which URL (without its password) failed to open, and that
// the time allowed ran out if it did.
func openErr(ctx context.Context, rawURL string, err error) error {
	what := "opening " + redacted(rawURL)
	if ctx.Err() != nil {
		what += " (timed out)"
	}
	return fmt.Errorf("%s: %w", what, err)
}

// redacted is rawURL as it may be printed: without its password if it
// parses; if it does not, only its scheme ("redis://…"), or "<a URL that
// does not parse>" if it does not begin with a valid scheme and "://".
// The text of a URL that does not parse is never shown: where its
// password ends is unknown.
func redacted(rawURL string) string {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil || atAfterHost(u, rawURL):
		if scheme, _, ok := strings.Cut(rawURL, "://"); ok && validScheme(scheme) {
			return scheme + "://…"
		}
		return "<a URL that does not parse>"
	case u.User != nil:
		return u.Redacted()
	}
	return rawURL
}

// validScheme reports whether s is a URL scheme (RFC 3986): a letter, then
// letters, digits, '+', '-' or '.'.
func validScheme(s string) bool {
	for i, c := range []byte(s) {
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

// atAfterHost reports whether rawURL, parsed as u, has no user information
// but an '@' after its host (in its path, query or fragment): most likely
// a password holding a '/', '?' or '#' that was not %-escaped, which
// url.Parse takes for the end of the host, and which u.Redacted would
// show. (A copy of the dlock package's, which refuses such URLs.)
func atAfterHost(u *url.URL, rawURL string) bool {
	if u.User != nil {
		return false
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}
