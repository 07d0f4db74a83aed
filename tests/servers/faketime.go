package servers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	tcexec "github.com/testcontainers/testcontainers-go/exec"
)

// ErrNoFaketime is returned (wrapped) by [StartRedisFaketime] when the Redis
// image has no libfaketime, so that the servers' clocks cannot be moved.
var ErrNoFaketime = errors.New("servers: the Redis image has no libfaketime")

// faketimeFile is the file in a faketime server's container that holds its
// realtime clock offset, in libfaketime's FAKETIME syntax ("+60.000000":
// seconds ahead of the real time).
const faketimeFile = "/tmp/dlock-faketime"

// faketimeScript is the sh -c script that runs a faketime server: it
// creates the offset file (zero) unless it exists (so an offset survives a
// restart of the server, as a machine's clock would), and runs the command
// line given as its arguments under Debian's libfaketime, found by a glob
// (its directory is /usr/lib/<multiarch triplet>/faketime). The server is
// multithreaded, so the thread-safe libfaketimeMT.so.1 is used.
//
// Only CLOCK_REALTIME is faked (time, gettimeofday, clock_gettime of the
// realtime clocks: what Redis expires keys and answers TIME by);
// FAKETIME_DONT_FAKE_MONOTONIC keeps the monotonic clock real, so timeouts
// and latency measurements are not disturbed. FAKETIME_NO_CACHE makes every
// clock read re-read the offset file, so that a change takes effect at
// once (libfaketime caches it for 10s by default).
//
// Two settings avoid a deadlock at start-up between libfaketime and
// jemalloc, which Debian's redis-server is linked with
// (github.com/wolfcw/libfaketime/issues/130): jemalloc's initialisation
// reads the clock, libfaketime's initialisation (run by that read) calls
// malloc, and that malloc reads the clock again, inside libfaketime's
// pthread_once. The mallocs come from looking up symbols the C library does
// not have (a failing dlsym allocates its error message) and from
// sem_open for the shared memory that the faketime wrapper program uses to
// share state between processes. FAKETIME_DISABLE_SHM=1 turns the shared
// memory off (a single server needs none), and FAKETIME_IGNORE_SYMBOLS
// names the missing symbols so that they are not looked up; the list is
// what libfaketime reports (FAKETIME_DEBUG_DLSYM=1) when preloaded into a
// program that does not use jemalloc (true), so it fits the image's
// libfaketime and C library.
//
// Without libfaketime the server runs unfaked (and says so in its log);
// StartRedisFaketime then finds no libfaketime mapped into the server and
// fails with ErrNoFaketime.
const faketimeScript = `f=` + faketimeFile + `
[ -e "$f" ] || printf '%s' +0 > "$f"
lib=$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null | head -n 1)
if [ -n "$lib" ]; then
	ignore=$(env LD_PRELOAD="$lib" FAKETIME_DISABLE_SHM=1 FAKETIME_DEBUG_DLSYM=1 true 2>&1 | sed -n 's/.*Cannot find symbol: //p' | tr '\n' ,)
	export LD_PRELOAD="$lib" FAKETIME_TIMESTAMP_FILE="$f" FAKETIME_NO_CACHE=1 \
		FAKETIME_DONT_FAKE_MONOTONIC=1 DONT_FAKE_MONOTONIC=1 \
		FAKETIME_DISABLE_SHM=1 FAKETIME_IGNORE_SYMBOLS="$ignore"
else
	echo "dlock: no /usr/lib/*/faketime/libfaketimeMT.so.1 in this image: the clock is not faked" >&2
fi
exec "$@"
`

// StartRedisFaketime is [StartRedisWithArgs] for servers whose clock can
// jump: each redis-server runs under libfaketime, with its realtime clock
// (what Redis expires keys by, and answers TIME with) offset from the real
// time by [Server.ShiftClock]; the offset starts at zero. The monotonic
// clock is not faked. The offset is kept across [Server.Stop],
// [Server.Kill] and [Server.Start], as a machine's clock would be.
//
// The image must have Debian's libfaketime package installed
// (/usr/lib/<arch>/faketime/libfaketimeMT.so.1, and sh, ls, sed, tr and
// env): the Redis stand-in that scripts/test.sh builds has it, the official
// redis image does not. Without it, StartRedisFaketime returns an error
// that matches [ErrNoFaketime]. The caller owns the servers and should
// Terminate them.
func StartRedisFaketime(ctx context.Context, n int, args ...string) ([]*Server, error) {
	k := *redisKind
	k.faketime = true
	k.cmd = func(p *plan, i int) []string {
		return append([]string{"sh", "-c", faketimeScript, "sh"}, append(redisKind.cmd(p, i), args...)...)
	}
	ss, err := start(ctx, &k, n)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		if err = s.checkFaketime(ctx); err != nil {
			break
		}
	}
	if err != nil {
		for _, s := range ss {
			_ = s.Terminate(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	return ss, nil
}

// checkFaketime makes sure that libfaketime is loaded into s's server
// process (the container's process 1).
func (s *Server) checkFaketime(ctx context.Context) error {
	maps, err := s.exec(ctx, "cat", "/proc/1/maps")
	if err != nil {
		return fmt.Errorf("servers: %s: check for libfaketime: %w", s, err)
	}
	if !strings.Contains(maps, "libfaketime") {
		return fmt.Errorf("%w (image %s; want Debian's libfaketime package, /usr/lib/<arch>/faketime/libfaketimeMT.so.1): "+
			"use the Redis stand-in that scripts/test.sh builds (Debian packages redis-server and libfaketime), "+
			"or set DLOCK_REDIS_IMAGE to an image with libfaketime installed",
			ErrNoFaketime, s.kind.image())
	}
	return nil
}

// ShiftClock sets the offset of s's realtime clock from the real time to
// d (not added to an earlier shift: ShiftClock(ctx, 0) puts the clock
// back): from when ShiftClock returns, the server's wall clock reads the
// real time plus d, so for d > 0 keys with a TTL expire d early (as after
// an NTP step or a leap of a virtual machine's clock), and for d < 0 late.
// The server keeps running; its monotonic clock is untouched. s must have
// been started by [StartRedisFaketime] and be running.
func (s *Server) ShiftClock(ctx context.Context, d time.Duration) error {
	if !s.kind.faketime {
		return fmt.Errorf("servers: shift the clock of %s: it was not started by StartRedisFaketime", s)
	}
	// libfaketime's offset syntax: a sign, then seconds (a fraction is
	// allowed; the decimal point is the C locale's, which Redis keeps).
	offset := strconv.FormatFloat(d.Seconds(), 'f', 6, 64)
	if d >= 0 {
		offset = "+" + offset
	}
	// Written to a temporary file and renamed, so that the server never
	// reads a half-written offset.
	script := `printf '%s' "$1" > "$2.tmp" && mv -f "$2.tmp" "$2"`
	if _, err := s.exec(ctx, "sh", "-c", script, "sh", offset, faketimeFile); err != nil {
		return fmt.Errorf("servers: shift the clock of %s by %v: %w", s, d, err)
	}
	return nil
}

// exec runs argv in s's container and returns its output (stdout and
// stderr); a non-zero exit status is an error.
func (s *Server) exec(ctx context.Context, argv ...string) (string, error) {
	code, r, err := s.c.Exec(ctx, argv, tcexec.Multiplexed())
	if err != nil {
		return "", err
	}
	out, err := io.ReadAll(r)
	if err == nil && code != 0 {
		err = fmt.Errorf("%s: exit status %d: %s", strings.Join(argv, " "), code, out)
	}
	return string(out), err
}
