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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

func init() {
	register(&command{name: "run", short: "run a command while holding a lock, or while leading (--elect)", run: runCmd})
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
   or: dlock run --elect [flags] KEY -- COMMAND [ARGS...]

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

The lock is stored with a description of its holder (--holder, by default
this machine's hostname and dlock's process ID, as in web-3/4242), which
dlock inspect shows.

With --permits N, KEY is a counting semaphore of N permits and COMMAND runs
holding one of them: at most N dlock run --permits N on one KEY and backend
run their commands at once (dlock.AcquireOptions.Permits). Every one must
give the same N: one that gives another while the key is held fails (exit
125). DLOCK_TOKEN is the permit's token, larger than that of every earlier
grant on KEY. With --shared, COMMAND runs holding a reader's lease of the
read-write lock KEY: any number of readers run together, and a plain
dlock run KEY (the writer) runs alone; a waiting writer keeps new readers
out. Backends without shared leases (Redlock) refuse both (exit 125).

With --elect, dlock is a candidate in a leader election on KEY
(dlock.Election): of all the dlock run --elect on one KEY and backend, on
any machines, one leads at a time, and only the leader runs COMMAND. Each
time this dlock is elected it starts COMMAND, with the environment above:
DLOCK_TOKEN is the leader's term, larger for each new leader as far as
the backend's fencing tokens are. Then:

  - when leadership is lost (the lease could not be refreshed), the
    command is stopped as a lost lease stops it (SIGTERM, then SIGKILL
    after --grace), and dlock campaigns again at once;
  - when the command exits by itself, with any status, dlock gives
    leadership up and campaigns again after a pause of about a second,
    so that another candidate may take over: a command that fails does
    not stop dlock (its status is reported on standard error), it is
    started again by the next leader, with no limit on the restarts;
  - SIGINT, SIGTERM or SIGHUP to dlock stops the command (SIGTERM, then
    SIGKILL after --grace) if it runs, gives the lease back, and dlock
    exits 0.

The next leader may start its command before a lost leader's command has
stopped (within --grace): pass DLOCK_TOKEN to the resource. If dlock
itself dies (SIGKILL, a crash), the kernel kills the command at once on
Linux (the parent-death signal, SIGKILL), so that it does not run on
beside the next leader's (unless the command execs a set-user-ID,
set-group-ID or file-capability program, for which the kernel drops that
signal); elsewhere it runs on, as with dlock run. A
command that starts processes of its own should stop them when it gets
SIGTERM, as SIGKILL reaches the command alone. --try, --wait and
--max-hold do not apply to a candidate and are refused. Exit status with
--elect: 0 once a signal stopped it; 125 dlock failed; 126 or 127 the
command could not be started (it is looked for before the campaign, and
a start that fails when elected gives the lease back and ends dlock); 2
usage error.

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
	grace := fs.Duration("grace", runDefaultGrace, "after a lost lease (with --elect: also on a signal to dlock), the `time`\n"+
		"between SIGTERM and SIGKILL to the command")
	maxHold := fs.Duration("max-hold", 0, "stop refreshing the lease this long after it was acquired, so that it runs out\n"+
		"and the command is stopped (exit 124); 0: refresh for as long as the command runs")
	elect := fs.Bool("elect", false, "campaign for leadership of KEY and run the command only while leading;\n"+
		"campaign again when it exits or leadership is lost, until a signal stops dlock")
	holder := fs.String("holder", "", "the holder's `description`, stored with the lock for dlock inspect: at most\n"+
		"256 bytes of printable characters (default hostname/pid)")
	permits := fs.Int("permits", 0, "hold one permit of a semaphore of `N` permits on KEY instead of the lock (N >= 1)")
	shared := fs.Bool("shared", false, "hold a reader's lease of the read-write lock KEY instead of the lock (the writer's)")
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
	case set["permits"] && *permits < 1:
		return usageErr("--permits %d: want a number of permits >= 1", *permits)
	case *shared && set["permits"]:
		return usageErr("--shared and --permits exclude each other (a semaphore's permits are shared already)")
	}
	if *elect {
		for _, f := range []struct{ name, why string }{
			{"try", "a candidate campaigns until it is stopped"},
			{"wait", "a candidate campaigns until it is stopped"},
			{"max-hold", "a leader leads for as long as it lives"},
			{"permits", "one leader at a time"},
			{"shared", "one leader at a time"},
		} {
			if set[f.name] {
				return usageErr("--elect and --%s exclude each other (%s)", f.name, f.why)
			}
		}
	}
	if *holder == "" {
		*holder = defaultHolder()
	} else if err := backend.ValidateHolder(*holder); err != nil {
		return usageErr("--holder %q: %s", *holder, strings.TrimPrefix(err.Error(), "dlock: "))
	}

	// Find the command before taking the lock: no lock for a typo.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
		return runStartStatus(err)
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

	if *elect {
		return runElect(ctx, e, locker, key, &dlock.ElectionOptions{TTL: *ttl, Holder: *holder}, path, argv, *grace, sigs)
	}
	ao := &dlock.AcquireOptions{TTL: *ttl, AutoRefresh: true, MaxHold: *maxHold, Holder: *holder, Permits: *permits, Shared: *shared}
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
	case errors.As(r.err, new(*dlock.PermitsError)) || errors.Is(r.err, dlock.ErrUnsupported):
		// Not a flag's syntax: the key's holders, or the backend, said no.
		fmt.Fprintf(e.stderr, "dlock run: %s\n", printable(r.err.Error()))
		return nil, exitDlockFailed
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
	c, err := startChild(e, lease, path, argv, false)
	if err != nil {
		fmt.Fprintf(e.stderr, "dlock run: %v\n", err)
		runRelease(e, lease)
		return runStartStatus(err)
	}
	leaseLost, waitErr := c.supervise(sigs, lease.Done(), grace, func() {
		fmt.Fprintf(e.stderr, "dlock run: lease on %s lost (%v): stopping the command (SIGTERM, SIGKILL after %v)\n", lease.Key(), printable(fmt.Sprint(lease.Err())), grace)
	})
	runRelease(e, lease)
	if leaseLost {
		return exitLeaseLost
	}
	return runExitStatus(e, c.cmd, waitErr)
}

// child is a command that dlock run started for a lease.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the command has exited and Wait returned
	err    error         // Wait's error, set before exited is closed
}

// startChild starts the command argv (path: where exec.LookPath found
// argv[0]) for lease, with dlock's standard input, output and error, and
// dlock's environment less the backend URLs (runChildEnv) plus DLOCK_KEY,
// DLOCK_TOKEN and DLOCK_DEADLINE. With dieWithDlock, the command is killed
// (SIGKILL) by the kernel if dlock dies before it, where the system can
// (setDieWithParent: Linux).
func startChild(e *env, lease *dlock.Lease, path string, argv []string, dieWithDlock bool) (*child, error) {
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
	lockThread := dieWithDlock && setDieWithParent(cmd)
	c := &child{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		if lockThread {
			// The parent-death signal comes when the thread that
			// started the command ends, not the process
			// (go.dev/issue/27505). The runtime ends a thread only
			// when a goroutine exits locked to it: this one keeps its
			// thread, locked, until the command has exited, so that
			// nothing ends the thread under a running command.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

// supervise waits for the command to exit, forwarding to it the signals
// received on sigs. Once stop is ready it stops the command: it calls
// stopping (to say why), sends SIGTERM, and SIGKILL after grace if the
// command has not exited by then. It returns whether the command was
// stopped, and Wait's error.
func (c *child) supervise(sigs <-chan os.Signal, stop <-chan struct{}, grace time.Duration, stopping func()) (stopped bool, err error) {
	var kill <-chan time.Time
	for {
		select {
		case <-c.exited:
			return stopped, c.err
		case s := <-sigs:
			_ = c.cmd.Process.Signal(s) // it may have exited already
		case <-stop:
			stop = nil
			stopped = true
			stopping()
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			_ = c.cmd.Process.Kill()
		}
	}
}

// runStartStatus is the exit status for a command that could not be
// started: 127 not found, else 126.
func runStartStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return exitNotFound
	}
	return exitCannotRun
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
