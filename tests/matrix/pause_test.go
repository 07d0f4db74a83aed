package matrix_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
)

// A client process is paused (SIGSTOP) inside its critical section, holding
// an auto-refreshed lease, for longer than the lease can last: its watchdog
// stops with it, as in a long GC pause or a stopped VM. The server lets the
// lease run out (Redis, Redlock, etcd: the TTL; ZooKeeper: the session
// timeout, after which the server deletes the lock node); contenders take
// the key and write the fenced register with larger tokens. Then the client
// resumes and makes the write it had prepared before the pause, late, with
// its old token, and releases. The fenced register must refuse the late
// write, and the stale release must not free a contender's lock (the
// checker would see the next grant overlap the holder's lease). The
// checker's liveness bound also covers the other half of the fault: once
// the paused client's lease is over (its last Deadline), the key must be
// free within e.progress.
//
// The lease's TTL is victimTTL, as long as the ZooKeeper session allows:
// there a lease's Deadline is the client-enforced TTL, and the server frees
// the key when the paused client's session expires, the session timeout
// (6.3s) after it last heard from the client, rounded up to the server's
// tick;
// a lease that outlived its session would show as an overlap. The key is
// then free well within e.progress (10s) after the lease's Deadline.
func init() {
	children[pauseChildName] = pauseChild
	register(&scenario{
		order:   10,
		name:    "ClientPause",
		row:     "client paused (SIGSTOP) past its TTL, then writes and releases",
		applies: all,
		expect:  expectIf(withoutTokens, violation, "without tokens the register cannot refuse the write the paused client makes after its lease ran out"),
		run: func(t *testing.T, e *env) {
			runClientPause(t, e, contenders(3, "c", &dlock.AcquireOptions{TTL: e.ttl}))
		},
	})
}

// The child process: its name in children, and the environment variables
// that tell it the lock.
const (
	pauseChildName = "pause"
	pauseURLEnv    = "DLOCK_MATRIX_PAUSE_URL" // the dlock.Open URL
	pauseKeyEnv    = "DLOCK_MATRIX_PAUSE_KEY" // the key
	pauseTTLEnv    = "DLOCK_MATRIX_PAUSE_TTL" // the lease's TTL (time.Duration)
	// pausePermitsEnv, when set to N > 0, makes the paused client take one
	// permit of a semaphore of N on the key instead of the key itself
	// (shared_test.go).
	pausePermitsEnv = "DLOCK_MATRIX_PAUSE_PERMITS"
)

// pauseMsg is one line (JSON) between the parent and the paused child.
//
// Child to parent: "ready" (its Locker is open), "acquired" (Token, TTL,
// Deadline), "deadline" (Deadline, whenever it changed), "lost" (Done fired
// before Release was invoked: Err, and LeaseLost: whether it matches
// ErrLeaseLost), "read" (asks the parent to read the
// register with its token), "write" (asks the parent to write Value+1 with
// its token, having read Value), "released" (Start, End, Err, NotHeld,
// LeaseLost of its Release, and LeaseErr, the lease's Err after it),
// "error" (Err: the child gives up). The election child (election_test.go)
// sends "acquired" when it is elected, and instead of "released": "ended"
// (Start: when its lead function's context ended, Err its cause, LeaseLost
// whether that matches ErrLeaseLost; End: when lead gave the term up) and
// "stopped" (Err: what Run returned). A client that holds a semaphore's
// permit (pausePermitsEnv) has no register to read and write (the holders
// of a semaphore are concurrent): instead of "read" and "write" it sends
// "holding" (Token) and waits for the parent's "resume".
//
// Parent to child: "acquire" ("campaign" for the election child), "value"
// (Value, OK: the read's result), "written" (OK: whether the write was
// accepted), "resume" (the permit holder goes on to its release).
type pauseMsg struct {
	Ev        string        `json:"ev"`
	Token     dlock.Token   `json:"token,omitempty"`
	TTL       time.Duration `json:"ttl,omitempty"`
	Deadline  int64         `json:"deadline,omitempty"` // unix nanoseconds
	Value     int64         `json:"value,omitempty"`
	OK        bool          `json:"ok,omitempty"`
	Start     int64         `json:"start,omitempty"` // unix nanoseconds
	End       int64         `json:"end,omitempty"`   // unix nanoseconds
	Err       string        `json:"err,omitempty"`
	NotHeld   bool          `json:"notHeld,omitempty"`
	LeaseLost bool          `json:"leaseLost,omitempty"`
	LeaseErr  string        `json:"leaseErr,omitempty"`
}

// pauseChild is the paused client (the child process's main): it takes the
// key (or a permit of it, see pausePermitsEnv) with AutoRefresh, reports
// its lease, and goes through its critical section with the parent, which
// holds the register (see pauseMsg).
func pauseChild() int {
	cio := newChildIO()
	send, fail, next := cio.send, cio.fail, cio.next
	l, key, ttl, err := childLocker()
	if err != nil {
		return fail("%v", err)
	}
	defer l.Close()
	permits := 0
	if v := os.Getenv(pausePermitsEnv); v != "" {
		if permits, err = strconv.Atoi(v); err != nil || permits < 1 {
			return fail("%s=%q: want a number of permits above 0", pausePermitsEnv, v)
		}
	}
	ctx := context.Background()
	send(pauseMsg{Ev: "ready"})

	if _, err := next("acquire"); err != nil {
		return fail("%v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	le, err := l.Acquire(actx, key, &dlock.AcquireOptions{TTL: ttl, AutoRefresh: true, MaxHold: time.Minute, Permits: permits})
	cancel()
	if err != nil {
		return fail("Acquire: %v", err)
	}
	send(pauseMsg{Ev: "acquired", Token: le.Token(), TTL: le.TTL(), Deadline: le.Deadline().UnixNano()})

	// Report the Deadline as the watchdog moves it, and Done.
	var releasing atomic.Bool
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		last := le.Deadline()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-le.Done():
				if !releasing.Load() {
					send(pauseMsg{Ev: "lost", Err: fmt.Sprint(le.Err()), LeaseLost: errors.Is(le.Err(), dlock.ErrLeaseLost)})
				}
				return
			case <-tick.C:
				if d := le.Deadline(); !d.Equal(last) {
					last = d
					send(pauseMsg{Ev: "deadline", Deadline: d.UnixNano()})
				}
			}
		}
	}()
	defer func() { close(stop); <-stopped }()

	if permits > 0 {
		// A permit's critical section: hold it until the parent says
		// go on. The parent stops this process while it waits.
		send(pauseMsg{Ev: "holding", Token: le.Token()})
		if _, err := next("resume"); err != nil {
			return fail("%v", err)
		}
	} else {
		// The critical section: read, work, write. The parent stops
		// this process right after answering the read.
		send(pauseMsg{Ev: "read", Token: le.Token()})
		v, err := next("value")
		if err != nil {
			return fail("%v", err)
		}
		if !v.OK {
			return fail("the register refused the read with token %d", le.Token())
		}
		time.Sleep(100 * time.Millisecond) // the work between read and write
		send(pauseMsg{Ev: "write", Token: le.Token(), Value: v.Value})
		if _, err := next("written"); err != nil {
			return fail("%v", err)
		}
	}

	select {
	case <-le.Done():
		<-stopped // the reporter has reported it
	default:
		releasing.Store(true)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	start := time.Now()
	err = le.Release(rctx)
	end := time.Now()
	cancel()
	send(pauseMsg{Ev: "released", Start: start.UnixNano(), End: end.UnixNano(), Err: pauseErrText(err),
		NotHeld: errors.Is(err, dlock.ErrNotHeld), LeaseLost: errors.Is(err, dlock.ErrLeaseLost), LeaseErr: pauseErrText(le.Err())})
	return 0
}

func pauseErrText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// childIO is a child process's side of the lines it exchanges with the
// parent (see pauseMsg): JSON lines on stdout and stdin.
type childIO struct {
	mu sync.Mutex
	in *bufio.Scanner
}

func newChildIO() *childIO { return &childIO{in: bufio.NewScanner(os.Stdin)} }

// send writes m to the parent.
func (c *childIO) send(m pauseMsg) {
	b, _ := json.Marshal(m)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

// fail reports that the child gives up, and returns its exit code.
func (c *childIO) fail(format string, args ...any) int {
	c.send(pauseMsg{Ev: "error", Err: fmt.Sprintf(format, args...)})
	return 1
}

// next reads the parent's next line, which must be ev.
func (c *childIO) next(ev string) (pauseMsg, error) {
	var m pauseMsg
	if !c.in.Scan() {
		return m, fmt.Errorf("waiting for %q: stdin ended (%v)", ev, c.in.Err())
	}
	if err := json.Unmarshal(c.in.Bytes(), &m); err != nil || m.Ev != ev {
		return m, fmt.Errorf("waiting for %q: got %q (%v)", ev, c.in.Text(), err)
	}
	return m, nil
}

// childLocker opens the child's Locker on the URL its environment names,
// and returns it with the key and the TTL the environment names.
func childLocker() (l *dlock.Locker, key string, ttl time.Duration, err error) {
	ttl, err = time.ParseDuration(os.Getenv(pauseTTLEnv))
	if err != nil {
		return nil, "", 0, fmt.Errorf("%s: %w", pauseTTLEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err = dlock.Open(ctx, os.Getenv(pauseURLEnv))
	if err != nil {
		return nil, "", 0, fmt.Errorf("Open: %w", err)
	}
	return l, os.Getenv(pauseKeyEnv), ttl, nil
}

// pausedClient is the parent's side of the paused child: the process, the
// lines it reports, and the lease it holds as recorded in the history.
type pausedClient struct {
	t    *testing.T
	e    *env
	name string // the client's name in the history
	cmd  *exec.Cmd

	stdin  io.WriteCloser
	msgs   chan pauseMsg // the child's lines but "deadline" and "lost"
	quit   chan struct{} // closed at cleanup: the reader stops delivering
	exited chan error    // the child's exit (cmd.Wait), once stdout ended
	stderr pauseBuffer

	mu       sync.Mutex
	askedAt  time.Time // when the parent asked for the lock
	acq      check.Op  // the recorded grant
	deadline time.Time // the last Deadline the child reported
	lost     string    // the lease's Err when Done fired, "" before
	// lostLeaseLost: the lease's Err when Done fired matches ErrLeaseLost.
	lostLeaseLost bool
	// permits is the semaphore's size the child takes a permit of (0: the
	// key itself), recorded with its grant.
	permits int
}

// startPausedClient starts the paused client (pauseChild) on url: see
// startChild. With permits > 0 it takes a permit of a semaphore of permits
// on the key, rather than the key.
func startPausedClient(t *testing.T, e *env, url string, permits int) *pausedClient {
	t.Helper()
	return startChild(t, e, pauseChildName, url, permits)
}

// startChild starts the child process child (a name in children) on url,
// with the key e.key, the TTL victimTTL and, when permits > 0, a
// semaphore of permits (pausePermitsEnv), and waits until its Locker is
// open (it sends "ready"). It is killed and reaped when the test ends,
// whatever happened.
func startChild(t *testing.T, e *env, child, url string, permits int) *pausedClient {
	t.Helper()
	c := &pausedClient{t: t, e: e, name: "paused", msgs: make(chan pauseMsg, 16), quit: make(chan struct{}), exited: make(chan error, 1), permits: permits}
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), childEnv+"="+child, pauseURLEnv+"="+url, pauseKeyEnv+"="+e.key, pauseTTLEnv+"="+victimTTL.String())
	if permits > 0 {
		c.cmd.Env = append(c.cmd.Env, pausePermitsEnv+"="+strconv.Itoa(permits))
	}
	c.cmd.Stderr = &c.stderr
	c.cmd.WaitDelay = 10 * time.Second
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go c.read(stdout)
	t.Cleanup(func() {
		_ = c.stdin.Close()
		close(c.quit)
		// SIGKILL ends a stopped process too; an exited one is reaped
		// already (Kill then fails with os.ErrProcessDone).
		_ = c.cmd.Process.Kill()
		if err := <-c.exited; err != nil || t.Failed() {
			t.Logf("child %d: exit: %v; its stderr:\n%s", c.cmd.Process.Pid, err, c.stderr.tail(4096))
		}
	})
	c.await("ready", time.Minute)
	return c
}

// read delivers the child's lines until its stdout ends, then reaps it.
// It records the grant, the Deadlines and Done as they come, so that no
// report waits on the test's own progress.
func (c *pausedClient) read(stdout io.Reader) {
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		var m pauseMsg
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			m = pauseMsg{Ev: "error", Err: fmt.Sprintf("unreadable line %q: %v", lines.Text(), err)}
		}
		now := time.Now()
		c.mu.Lock()
		switch m.Ev {
		case "acquired":
			c.deadline = time.Unix(0, m.Deadline)
			c.acq = check.Op{Kind: check.Acquire, Client: c.name, Key: c.e.key, Wait: true, Start: c.askedAt, End: now,
				Token: m.Token, TTL: m.TTL, Deadline: c.deadline, Shared: c.permits > 0, Permits: c.permits}
			c.acq.ID = c.e.h.Add(c.acq)
		case "deadline":
			c.deadline = time.Unix(0, m.Deadline)
		case "lost":
			c.lost, c.lostLeaseLost = m.Err, m.LeaseLost
			// Deadline: the last one reported, the end of the lease's
			// validity as the child knew it.
			c.e.h.Add(check.Op{Kind: check.Lost, Client: c.name, Key: c.e.key, Lease: c.acq.ID, Start: now, End: now, Deadline: c.deadline,
				Err: fmt.Errorf("%w: %s", dlock.ErrLeaseLost, m.Err)})
		}
		c.mu.Unlock()
		if m.Ev == "deadline" || m.Ev == "lost" {
			continue
		}
		select {
		case c.msgs <- m:
		case <-c.quit:
		}
	}
	// Every read from the pipe is done: Wait may close it.
	c.exited <- c.cmd.Wait()
}

// send writes m to the child's stdin.
func (c *pausedClient) send(m pauseMsg) {
	c.t.Helper()
	b, _ := json.Marshal(m)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		c.t.Fatalf("child: sending %s: %v", m.Ev, err)
	}
}

// await returns the child's next message, which must be ev, within d.
func (c *pausedClient) await(ev string, d time.Duration) pauseMsg {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		if m.Ev != ev {
			c.t.Fatalf("child: waiting for %q, got %+v", ev, m)
		}
		return m
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		c.t.Fatalf("child: exited (%v) while the test waited for %q", err, ev)
	case <-time.After(d):
		c.t.Fatalf("child: no %q within %v", ev, d)
	}
	panic("unreachable")
}

// signal sends sig to the child and waits until /proc shows it stopped
// (SIGSTOP) or running again (SIGCONT): the fault has taken effect.
func (c *pausedClient) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("child: %v: %v", sig, err)
	}
	want := sig == syscall.SIGSTOP
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		stopped, err := pauseStopped(c.cmd.Process.Pid)
		if err != nil {
			c.t.Fatalf("child: %v", err)
		}
		if stopped == want {
			return
		}
		if time.Now().After(end) {
			c.t.Fatalf("child: still stopped=%v 10s after %v", stopped, sig)
		}
	}
}

// pauseStopped reports whether process pid is stopped by a signal, from
// the state field of /proc/pid/stat.
func pauseStopped(pid int) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false, err
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return b[i+2] == 'T', nil
}

// lease returns the recorded grant, the last Deadline reported and the
// lease's Err when Done fired ("" if it has not).
func (c *pausedClient) lease() (acq check.Op, deadline time.Time, lost string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acq, c.deadline, c.lost
}

// contender is a client of a scenario that takes the key over and over
// (env.cycle) with the options o.
type contender struct {
	name string
	o    *dlock.AcquireOptions
}

// contenders returns n contenders named prefix0 … prefix(n-1), all with o.
func contenders(n int, prefix string, o *dlock.AcquireOptions) []contender {
	var cs []contender
	for i := range n {
		cs = append(cs, contender{fmt.Sprintf("%s%d", prefix, i), o})
	}
	return cs
}

// startCycling runs contender cs[i] on Locker ls[i], over and over: a
// cycle (acquires waiting up to wait, holding for hold) until e.stopAll,
// or until the i-th function it returns is called.
func (e *env) startCycling(ctx context.Context, cs []contender, ls []*dlock.Locker, wait, hold time.Duration) []func() {
	stops := make([]func(), len(ls))
	for i, l := range ls {
		name, o := cs[i].name, cs[i].o
		stops[i] = e.goStop(func(stop <-chan struct{}) {
			cctx, cancel := stopContext(ctx, stop)
			defer cancel()
			for cctx.Err() == nil {
				if err := e.cycle(cctx, name, l, o, wait, hold); err != nil && cctx.Err() == nil {
					time.Sleep(50 * time.Millisecond) // not a tight loop on a failing server
				}
			}
		})
	}
	return stops
}

// runClientPause is the scenario's run (see the comment on init), with the
// contenders cs; at least one of them must write the register (a mutex's
// holder, a writer), the read-write lock's row adds readers. It returns
// the functions that stop each contender's cycling (see startCycling).
func runClientPause(t *testing.T, e *env, cs []contender) []func() {
	const (
		hold  = 250 * time.Millisecond // a contender's critical section
		bound = time.Minute            // for every wait on the servers or the child
	)
	d := e.deployment()
	c := startPausedClient(t, e, d.url(d.addrs()), 0)
	// The contenders' Lockers (separate clients), opened before the child
	// takes the lock so that its critical section is not stretched by
	// their connecting.
	var ls []*dlock.Locker
	for range cs {
		ls = append(ls, e.locker())
	}
	prober := e.locker()

	c.mu.Lock()
	c.askedAt = time.Now()
	c.mu.Unlock()
	c.send(pauseMsg{Ev: "acquire"})
	c.await("acquired", bound)
	acq, _, _ := c.lease()
	t.Logf("child %d holds the key: token %d, TTL %v", c.cmd.Process.Pid, acq.Token, acq.TTL)

	ctx := t.Context()
	stops := e.startCycling(ctx, cs, ls, bound, hold)

	// The child asks to read right after acquiring; it is stopped inside
	// its critical section until a contender has written.
	taken, pausedAt, before, resumedAt := c.pauseInside(acq, bound, "holder", "contender")
	first, _ := pauseFind(e.h, func(op check.Op) bool { return op.Granted() && op.Client != c.name })
	t.Logf("paused %v (lease TTL %v); the lease's last Deadline before the pause was %v after pausing; a contender was granted %v after it (token %d), and wrote the register with token %d",
		resumedAt.Sub(pausedAt).Round(time.Millisecond), acq.TTL, before.Sub(pausedAt).Round(time.Millisecond),
		first.End.Sub(before).Round(time.Millisecond), first.Token, taken.Token)

	// The write the child prepared before the pause arrives now.
	w := c.await("write", bound)
	accepted := e.reg.Write(c.name, acq.ID, w.Token, before, w.Value)
	g := e.guarantees()
	switch {
	case accepted && g.Fencing != dlock.FencingNone:
		t.Errorf("the paused holder's late write with token %d was accepted after a contender wrote with token %d", w.Token, taken.Token)
	case !accepted:
		t.Logf("the late write with token %d was refused", w.Token)
	}
	// Let the child release while a contender has just been granted the
	// key (it holds it for hold): a stale release that freed the key
	// would let the next contender in during that hold.
	since := time.Now()
	if _, ok := pauseAwait(e.h, bound, func(op check.Op) bool {
		return op.Granted() && op.Client != c.name && op.End.After(since)
	}); !ok {
		t.Fatalf("no contender was granted the key within %v after the paused holder resumed", bound)
	}
	// Probe the key all through the stale release (see env.probe).
	stopProbe := e.probe(ctx, prober)
	c.send(pauseMsg{Ev: "written", OK: accepted})
	rel := c.await("released", bound)
	time.Sleep(2 * hold) // the prober goes on for a holder's critical section after the release
	t.Logf("%d probes of the key around the stale release", stopProbe())
	relErr := errors.New(rel.Err)
	switch {
	case rel.NotHeld:
		relErr = fmt.Errorf("%w: %s", dlock.ErrNotHeld, rel.Err)
	case rel.LeaseLost:
		relErr = fmt.Errorf("%w: %s", dlock.ErrLeaseLost, rel.Err)
	case rel.Err == "":
		relErr = nil
	}
	e.h.Add(check.Op{Kind: check.Release, Client: c.name, Key: e.key, Lease: acq.ID, Start: time.Unix(0, rel.Start), End: time.Unix(0, rel.End), Err: relErr})
	if !rel.NotHeld && !rel.LeaseLost {
		t.Errorf("the paused holder's Release after its lease ran out = %q, want ErrNotHeld or ErrLeaseLost", rel.Err)
	}
	if _, _, lost := c.lease(); lost == "" {
		t.Errorf("the paused holder's Done did not fire before its Release (Err after Release: %s)", rel.LeaseErr)
	} else {
		t.Logf("the paused holder's Done fired: %s; its Release: %s", lost, rel.Err)
	}
	select {
	case err := <-c.exited:
		c.exited <- err // for the cleanup
		if err != nil {
			t.Errorf("child: %v", err)
		}
	case <-time.After(bound):
		t.Errorf("child: not exited within %v of its Release", bound)
	}
	// A few more handoffs after the stale release, for the checker.
	since = time.Now()
	for range cs {
		op, ok := pauseAwait(e.h, bound, func(op check.Op) bool { return op.Granted() && op.End.After(since) })
		if !ok {
			t.Fatalf("no contender was granted the key within %v after the paused holder's release", bound)
		}
		since = op.End
	}
	return stops
}

// pauseInside pauses the child, which holds the lease granted by acq, inside
// its critical section: it answers the child's read of the register, stops
// it (SIGSTOP) as soon as it has the value, keeps it stopped until its lease
// is over and another client has written the register with a larger token
// (within bound), and resumes it (SIGCONT). It returns that write, when the
// pause began, the child's last Deadline before the pause (every line it
// wrote before it stopped has been read by then: the end of its lease's
// validity) and when it resumed. who and other name the child and the
// others in failures ("holder" and "contender", "leader" and "candidate").
func (c *pausedClient) pauseInside(acq check.Op, bound time.Duration, who, other string) (taken check.Op, pausedAt, before, resumedAt time.Time) {
	t, e := c.t, c.e
	r := c.await("read", bound)
	v, ok := e.reg.Read(r.Token)
	if !ok {
		t.Fatalf("the register refused the first %s's read (token %d)", who, r.Token)
	}
	c.send(pauseMsg{Ev: "value", Value: v, OK: true})
	c.signal(syscall.SIGSTOP)
	pausedAt = time.Now()
	for end := time.Now().Add(bound); ; time.Sleep(20 * time.Millisecond) {
		_, deadline, _ := c.lease()
		if op, ok := pauseFind(e.h, func(op check.Op) bool {
			return op.Kind == check.Write && op.Accepted && op.Token > acq.Token
		}); ok && time.Now().After(deadline) {
			taken = op
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no %s wrote the register with a token above %d within %v of pausing the %s", other, acq.Token, bound, who)
		}
	}
	_, before, _ = c.lease()
	resumedAt = time.Now()
	c.signal(syscall.SIGCONT)
	return taken, pausedAt, before, resumedAt
}

// pauseFind returns the first op of h that matches.
func pauseFind(h *check.History, match func(check.Op) bool) (check.Op, bool) {
	for _, op := range h.Ops() {
		if match(op) {
			return op, true
		}
	}
	return check.Op{}, false
}

// pauseAwait polls h until an op matches, for up to d.
func pauseAwait(h *check.History, d time.Duration, match func(check.Op) bool) (check.Op, bool) {
	for end := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if op, ok := pauseFind(h, match); ok {
			return op, true
		}
		if time.Now().After(end) {
			return check.Op{}, false
		}
	}
}

// pauseBuffer is a bytes.Buffer safe for concurrent use (the child's
// stderr, copied by os/exec while the test may read it).
type pauseBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *pauseBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// tail returns the last n bytes written.
func (s *pauseBuffer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b.Bytes()
	return strings.ToValidUTF8(string(b[max(0, len(b)-n):]), "?")
}
