package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

func init() {
	register(&command{name: "run", short: "run a command while holding a lock", run: runCmd})
}

// Defaults of dlock run's flags.
const (
	runDefaultTTL   = 15 * time.Second
	runDefaultWait  = 30 * time.Second
	runDefaultGrace = 10 * time.Second
	// runReleaseTimeout bounds the release after the command has exited.
	runReleaseTimeout = 10 * time.Second
)

// runDeadlineLayout is RFC 3339 with milliseconds, for DLOCK_DEADLINE.
const runDeadlineLayout = "2006-01-02T15:04:05.000Z07:00"

const runUsage = `usage: dlock run [flags] KEY -- COMMAND [ARGS...]

Run acquires the lock KEY, runs COMMAND with ARGS while holding it, and
releases it when the command exits. The lease is refreshed in the
background (every TTL/3) for as long as the command runs. The command's
standard input, output and error are dlock's; its environment is dlock's
plus DLOCK_KEY (the key), DLOCK_TOKEN (the lease's fencing token, a
decimal integer: pass it to the protected resource with every write) and
DLOCK_DEADLINE (the lease's deadline at the start, RFC 3339; it moves
later with each refresh), less $DLOCK_URL, $DLOCK_CORRECTNESS_URL and
$DLOCK_EFFICIENCY_URL: the backend's URLs, which may hold its password,
are not handed to the command. A command that needs one is given it
explicitly:

	dlock run KEY -- env DLOCK_URL="$DLOCK_URL" COMMAND

The exit status is the command's (128+N if signal N ended it), or:

	75   the lock was not acquired: --try found it held, or --wait passed
	124  the lease was lost (a refresh found the lock gone, or the backend
	     unreachable until the lease ran out, or --max-hold passed): the
	     command was sent SIGTERM, then SIGKILL after --grace
	125  dlock failed (bad URL, backend unreachable)
	126  the command could not be started
	127  the command was not found
	2    usage error

SIGINT, SIGTERM and SIGHUP sent to dlock are forwarded to the command,
which decides what to do with them; the lock is released once it has
exited. (A ^C at a terminal reaches the command from the terminal too.)
If dlock itself is killed (SIGKILL), the command keeps running without the
lock once the lease's TTL has passed.

` + backendHelp + `

Flags:
`

// runCmd is dlock run.
func runCmd(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet("run", runUsage)
	rawURL, purpose := backendFlags(fs)
	ttl := fs.Duration("ttl", runDefaultTTL, "the lease's `TTL`, refreshed every TTL/3 (overrides the URL's ttl parameter)")
	wait := fs.Duration("wait", runDefaultWait, "give up (exit 75) if the lock is not acquired within this `duration`; 0: wait as long as it takes")
	try := fs.Bool("try", false, "make one attempt: exit 75 at once if the lock is held")
	grace := fs.Duration("grace", runDefaultGrace, "after a lost lease, the `time` between SIGTERM and SIGKILL to the command")
	maxHold := fs.Duration("max-hold", 0, "stop refreshing the lease this long after it was acquired, so that it runs out\n"+
		"and the command is stopped (exit 124); 0: refresh for as long as the command runs")
	if status, ok := parseFlags(e, "run", fs, args); !ok {
		return status
	}
	usageErr := func(format string, a ...any) int { return usageFail(e, "run", format, a...) }
	rest := fs.Args()
	if len(rest) == 0 {
		return usageErr("missing KEY and COMMAND")
	}
	key := rest[0]
	rest = rest[1:]
	if len(rest) == 0 || rest[0] != "--" {
		return usageErr("want KEY -- COMMAND [ARGS...] (flags go before KEY)")
	}
	argv := rest[1:]
	if len(argv) == 0 {
		return usageErr("missing COMMAND after --")
	}
	if err := backend.ValidateKey(key); err != nil {
		return usageErr("%s", keyErr(key, err))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *try && set["wait"]:
		return usageErr("--try and --wait exclude each other")
	case *ttl <= 0:
		return usageErr("--ttl %v: want a positive duration", *ttl)
	case *wait < 0:
		return usageErr("--wait %v: want a duration >= 0", *wait)
	case *grace < 0:
		return usageErr("--grace %v: want a duration >= 0", *grace)
	case *maxHold < 0:
		return usageErr("--max-hold %v: want a duration >= 0", *maxHold)
	}

	// Find the command before taking the lock: no lock for a typo.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}

	// From here, signals to dlock are the command's: caught now so that
	// one that comes while dlock waits for the lock does not kill dlock
	// with the lock half taken.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	locker, err := openLocker(ctx, e, *rawURL, *purpose)
	if err != nil {
		if isUsage(err) {
			return usageErr("%v", err)
		}
		fmt.Fprintf(e.stderr, "dlock run: %s\n", printable(err.Error()))
		return exitDlockFailed
	}
	defer locker.Close()

	ao := &dlock.AcquireOptions{TTL: *ttl, AutoRefresh: true, MaxHold: *maxHold}
	if *maxHold == 0 {
		ao.MaxHold = math.MaxInt64 // for as long as the command runs
	}
	lease, status := runAcquire(ctx, e, locker, key, ao, *try, *wait, sigs)
	if lease == nil {
		return status
	}
	return runLocked(e, lease, path, argv, *grace, sigs)
}

// runAcquire takes key, once (try) or waiting up to wait (0: no limit). A
// signal while it waits ends the wait: dlock exits as the signal would
// have ended it (128+N). It returns the lease, or nil and the exit status.
func runAcquire(ctx context.Context, e *env, locker *dlock.Locker, key string, ao *dlock.AcquireOptions, try bool, wait time.Duration, sigs <-chan os.Signal) (*dlock.Lease, int) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !try && wait > 0 {
		var cancelT context.CancelFunc
		actx, cancelT = context.WithTimeout(actx, wait)
		defer cancelT()
	}
	type result struct {
		lease *dlock.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if try {
			r.lease, r.err = locker.TryAcquire(actx, key, ao)
		} else {
			r.lease, r.err = locker.Acquire(actx, key, ao)
		}
		done <- r
	}()
	var sig os.Signal
	var r result
	for r.lease == nil && r.err == nil {
		select {
		case r = <-done:
		case s := <-sigs:
			if sig == nil {
				sig = s
				cancel(fmt.Errorf("signal %v", s))
			}
		}
	}
	switch {
	case r.err == nil && sig != nil: // the lock came with the signal
		runRelease(e, r.lease)
		return nil, runSignalStatus(sig)
	case r.err == nil:
		return r.lease, exitOK
	case sig != nil:
		fmt.Fprintf(e.stderr, "dlock run: %v while waiting for the lock\n", sig)
		return nil, runSignalStatus(sig)
	case errors.Is(r.err, dlock.ErrInvalidKey) || errors.Is(r.err, dlock.ErrInvalidTTL) || errors.Is(r.err, dlock.ErrInvalidConfig):
		fmt.Fprintf(e.stderr, "dlock run: %s\nRun 'dlock run -h' for usage.\n", printable(r.err.Error()))
		return nil, exitUsage
	case try && errors.Is(r.err, dlock.ErrNotAcquired):
		fmt.Fprintf(e.stderr, "dlock run: %s is held (--try)\n", key)
		return nil, exitNotAcquired
	case errors.Is(r.err, dlock.ErrNotAcquired) && errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() == nil:
		fmt.Fprintf(e.stderr, "dlock run: %s is held: not acquired within %v (--wait)\n", key, wait)
		return nil, exitNotAcquired
	}
	fmt.Fprintf(e.stderr, "dlock run: %s\n", printable(r.err.Error()))
	return nil, exitDlockFailed
}

// runLocked runs the command while lease is held, and releases the lease
// once it has exited. It returns the exit status (see runUsage).
func runLocked(e *env, lease *dlock.Lease, path string, argv []string, grace time.Duration, sigs <-chan os.Signal) int {
	cmd := &exec.Cmd{
		Path:   path,
		Args:   argv,
		Stdin:  e.stdin,
		Stdout: e.stdout,
		Stderr: e.stderr,
		Env: append(runChildEnv(os.Environ()),
			"DLOCK_KEY="+lease.Key(),
			"DLOCK_TOKEN="+strconv.FormatUint(uint64(lease.Token()), 10),
			"DLOCK_DEADLINE="+lease.Deadline().UTC().Format(runDeadlineLayout)),
		// Output copied through a pipe (e.stdout not a file): do not wait
		// for a grandchild that keeps it open.
		WaitDelay: time.Second,
	}
	if runNilReader(e.stdin) {
		cmd.Stdin = nil
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
		runRelease(e, lease)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	lost := lease.Done()
	var kill <-chan time.Time
	leaseLost := false
	var waitErr error
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case s := <-sigs:
			_ = cmd.Process.Signal(s) // it may have exited already
		case <-lost:
			lost = nil
			leaseLost = true
			fmt.Fprintf(e.stderr, "dlock run: lease on %s lost (%v): stopping the command (SIGTERM, SIGKILL after %v)\n", lease.Key(), printable(fmt.Sprint(lease.Err())), grace)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			_ = cmd.Process.Kill()
		}
	}
	runRelease(e, lease)
	if leaseLost {
		return exitLeaseLost
	}
	return runExitStatus(e, cmd, waitErr)
}

// runChildEnv is environ without the variables that name a backend
// ($DLOCK_URL, $DLOCK_CORRECTNESS_URL, $DLOCK_EFFICIENCY_URL): their URLs
// may hold a password, which the command has no need of.
func runChildEnv(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == envURL || name == envCorrectness || name == envEfficiency
	})
}

// runRelease gives the lock back, warning on e.stderr if that fails
// (the lock then ends with its TTL). A lease lost already is not an error.
func runRelease(e *env, lease *dlock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), runReleaseTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		fmt.Fprintf(e.stderr, "dlock run: warning: %s (the lock ends with its TTL)\n", printable(err.Error()))
	}
}

// runExitStatus is the command's exit status, 128+N for a signal N.
func runExitStatus(e *env, cmd *exec.Cmd, err error) int {
	ps := cmd.ProcessState
	if ps == nil {
		fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
		return exitDlockFailed
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// runSignalStatus is the exit status of a process ended by s: 128+N.
func runSignalStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return exitFailure
}

// runNilReader reports whether r is nil or a nil *os.File.
func runNilReader(r io.Reader) bool {
	if r == nil {
		return true
	}
	f, ok := r.(*os.File)
	return ok && f == nil
}
