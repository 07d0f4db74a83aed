package failover

// The parent side: it starts the servers, runs the candidates as processes
// (candidate_test.go), kills the leader and times the next one's election.
// See the package documentation (doc.go) for the method.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

// TestMain makes the process a candidate when candidateEnv is set (the
// parent re-runs the test binary so), and otherwise runs the tests with
// the package's servers.
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(candidateEnv); ok {
		os.Exit(runCandidate(spec))
	}
	servers.Main(m)
}

const (
	// failoverLease is the lease time of every configuration.
	failoverLease = 3 * time.Second
	// zkTick is the test ZooKeeper servers' tickTime.
	zkTick = servers.ZooKeeperTick
	// zkTTL is the longest Election TTL a session of failoverLease
	// allows (package zookeeper: timeout - timeout/3 - tickTime).
	zkTTL = failoverLease - failoverLease/3 - zkTick

	// smokeRuns is the number of runs per configuration when
	// DLOCK_FAILOVER_RUNS is not set (`make test`).
	smokeRuns = 2
	// startTimeout bounds a candidate's start: the process, its
	// connection, its first report (and A's election on a fresh key).
	startTimeout = time.Minute
	// failoverTimeout bounds the wait for the new leader after the kill:
	// 20 lease times, generous on a loaded machine; the figures are
	// read from the table, never checked.
	failoverTimeout = 20 * failoverLease
)

// Environment knobs; see the package documentation.
const (
	envRuns  = "DLOCK_FAILOVER_RUNS"
	envOnly  = "DLOCK_FAILOVER_ONLY"
	envTable = "DLOCK_FAILOVER_TABLE"
)

// configuration is one row of the table: a library on a backend.
type configuration struct {
	name     string // for DLOCK_FAILOVER_ONLY and the subtests
	election string // the library, as the table shows it
	backend  string // the servers, as the table shows them
	settings string // how the lease time is set
	// spec starts (or reuses) the package's servers and returns the
	// candidates' spec, without Key and ID.
	spec func(t *testing.T) candidateSpec
}

func configurations() []configuration {
	lease := failoverLease
	secs := int(lease / time.Second)
	dlockSpec := func(url string) candidateSpec {
		return candidateSpec{Lib: libDlock, URL: url, TTL: lease, Lease: lease}
	}
	etcdEndpoints := func(t *testing.T) []string { return servers.Etcd(t, 1).Endpoints() }
	return []configuration{
		{"dlock-redis", "dlock Election", "Redis, 1 server", fmt.Sprintf("TTL %v", lease),
			func(t *testing.T) candidateSpec {
				return dlockSpec(fmt.Sprintf("redis://%s?ttl=%v", servers.Redis(t, 1)[0].Addr(), lease))
			}},
		{"dlock-redlock", "dlock Election", "Redlock, 5 Redis masters", fmt.Sprintf("TTL %v", lease),
			func(t *testing.T) candidateSpec {
				var addrs []string
				for _, s := range servers.Redis(t, 5) {
					addrs = append(addrs, s.Addr())
				}
				return dlockSpec(fmt.Sprintf("redlock://%s?ttl=%v", strings.Join(addrs, ","), lease))
			}},
		{"dlock-etcd", "dlock Election", "etcd, 1 member", fmt.Sprintf("TTL %v", lease),
			func(t *testing.T) candidateSpec {
				return dlockSpec(fmt.Sprintf("etcd://%s?ttl=%v", strings.Join(etcdEndpoints(t), ","), lease))
			}},
		{"dlock-zookeeper", "dlock Election", "ZooKeeper, 1 server (tickTime 200ms)",
			fmt.Sprintf("session_timeout=%v (TTL %v, tick_time=%v)", lease, zkTTL, zkTick),
			func(t *testing.T) candidateSpec {
				s := dlockSpec(fmt.Sprintf("zk://%s?session_timeout=%v&tick_time=%v&ttl=%v",
					strings.Join(servers.ZooKeeper(t, 1).Servers(), ","), lease, zkTick, zkTTL))
				s.TTL = zkTTL
				return s
			}},
		{"etcd-election", "etcd concurrency.Election", "etcd, 1 member", fmt.Sprintf("Session TTL %d", secs),
			func(t *testing.T) candidateSpec {
				return candidateSpec{Lib: libEtcd, Endpoints: etcdEndpoints(t), Lease: lease}
			}},
		{"client-go", "client-go leaderelection (its resourcelock on etcd, not an API server)", "etcd, 1 member",
			fmt.Sprintf("LeaseDuration %v, RenewDeadline %v, RetryPeriod %v", lease, lease*10/15, lease*2/15),
			func(t *testing.T) candidateSpec {
				return candidateSpec{Lib: libClientGo, Endpoints: etcdEndpoints(t), Lease: lease}
			}},
	}
}

// TestFailover measures, per configuration, the time from the SIGKILL of
// the leader's process to the next candidate's election, and checks each
// run: the first candidate leads, the second does not while the first
// lives, leads after the kill, with a higher term. It prints the table of
// the figures; it checks no figure.
func TestFailover(t *testing.T) {
	runs, full := smokeRuns, false
	if v := os.Getenv(envRuns); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of runs, at least 1", envRuns, v)
		}
		runs, full = n, true
	}
	var cfgs []configuration
	only := regexp.MustCompile("")
	if v := os.Getenv(envOnly); v != "" {
		var err error
		if only, err = regexp.Compile(v); err != nil {
			t.Fatalf("%s: %v", envOnly, err)
		}
	}
	for _, c := range configurations() {
		if only.MatchString(c.name) {
			cfgs = append(cfgs, c)
		}
	}
	if len(cfgs) == 0 {
		t.Fatalf("%s=%q matches no configuration", envOnly, os.Getenv(envOnly))
	}

	results := make([][]time.Duration, len(cfgs))
	var mu sync.Mutex
	record := func(i int, d time.Duration) {
		mu.Lock()
		results[i] = append(results[i], d)
		mu.Unlock()
	}
	if full {
		// One configuration after another, run by run: a burst of
		// load from elsewhere lands on every configuration alike.
		specs := make([]candidateSpec, len(cfgs))
		for i, c := range cfgs {
			specs[i] = c.spec(t)
		}
		for r := 1; r <= runs; r++ {
			for i, c := range cfgs {
				t.Run(fmt.Sprintf("%s/run=%d", c.name, r), func(t *testing.T) {
					d := runOnce(t, specs[i])
					t.Logf("%s run %d: new leader %v after the kill", c.name, r, d.Round(time.Millisecond))
					record(i, d)
				})
			}
		}
	} else {
		// The smoke test (`make test`): the configurations in
		// parallel, to be quick; these figures are not the table's.
		t.Run("smoke", func(t *testing.T) {
			for i, c := range cfgs {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					spec := c.spec(t)
					for r := 1; r <= runs; r++ {
						d := runOnce(t, spec)
						t.Logf("run %d: new leader %v after the kill", r, d.Round(time.Millisecond))
						record(i, d)
					}
				})
			}
		})
	}

	table := formatTable(cfgs, results, runs, full)
	t.Log("\n" + table)
	if path := os.Getenv(envTable); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// keySeq tells the keys of one process's runs apart.
var keySeq atomic.Int64

// runOnce runs one failover on a fresh key and returns the time from the
// kill of the leader (A) to the report of the next one (B).
func runOnce(t *testing.T, spec candidateSpec) time.Duration {
	t.Helper()
	key := fmt.Sprintf("failover-%d-%d", time.Now().UnixNano(), keySeq.Add(1))
	switch spec.Lib {
	case libEtcd:
		spec.Key = "/failover/etcd-election/" + key
	case libClientGo:
		spec.Key = "/failover/client-go/" + key
	default:
		spec.Key = key
	}

	a := startCandidate(t, spec, "A")
	termA := a.leading(t, startTimeout)
	b := startCandidate(t, spec, "B")
	b.await(t, "campaigning", startTimeout)
	// Settle, so that B waits as a follower does, and so that the kill
	// lands at a random point of the leader's renewal cycle. Nothing
	// may happen meanwhile: A leads, B waits.
	quiet(t, time.Second+rand.N(failoverLease/3), a, b)

	killed := time.Now()
	a.kill(t)
	termB := b.leading(t, failoverTimeout)
	d := b.leadAt.Sub(killed)
	if termB <= termA {
		t.Errorf("the new leader's term %d is not higher than the killed leader's %d", termB, termA)
	}
	b.kill(t)
	return d
}

// quiet waits for d and fails t if any candidate reports anything or ends
// meanwhile.
func quiet(t *testing.T, d time.Duration, ps ...*candidate) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		for _, p := range ps {
			select {
			case l, ok := <-p.lines:
				if !ok {
					p.fatal(t, "ended while the leader should still lead")
				}
				p.fatal(t, fmt.Sprintf("reported %q while the first leader lived and led", l.text))
			default:
			}
		}
		select {
		case <-timer.C:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// candidate is one candidate process, as the parent sees it.
type candidate struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.Closer
	lines  chan line     // its stdout, one timestamped line each; closed at EOF
	done   chan struct{} // closed when the process has been waited for
	stderr *tail
	waited error     // Wait's result, once done is closed
	leadAt time.Time // when it reported leading
}

// line is one line of a candidate's stdout and the time it was read.
type line struct {
	at   time.Time
	text string
}

// startCandidate starts a candidate process of spec with ID name (and
// the key, to tell the runs apart), killed when t ends if still running.
func startCandidate(t *testing.T, spec candidateSpec, name string) *candidate {
	t.Helper()
	spec.ID = name + "-" + spec.Key
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{name: name, lines: make(chan line, 16), done: make(chan struct{}), stderr: &tail{max: 16 << 10}}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(os.Environ(), candidateEnv+"="+string(js))
	c.cmd.Stderr = c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Never written: the candidate exits when it is closed (it reads
	// EOF), so none outlives this process.
	stdin, err := c.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- line{time.Now(), sc.Text()}
		}
		close(c.lines)
		c.waited = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.stdin.Close()
		for range c.lines { // let the reader reach EOF and Wait
		}
		<-c.done
	})
	return c
}

// await waits, up to d, for a line of c that starts with prefix and
// returns it; any other line, or c's end, fails t.
func (c *candidate) await(t *testing.T, prefix string, d time.Duration) line {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.fatal(t, fmt.Sprintf("ended before reporting %q", prefix))
		}
		if !strings.HasPrefix(l.text, prefix) {
			c.fatal(t, fmt.Sprintf("reported %q, want %q", l.text, prefix))
		}
		return l
	case <-time.After(d):
		c.fatal(t, fmt.Sprintf("did not report %q within %v", prefix, d))
	}
	panic("unreachable")
}

// leading waits, up to d, for c's "campaigning" (unless it came already)
// and "leading TERM" lines, records the time of the latter and returns
// TERM.
func (c *candidate) leading(t *testing.T, d time.Duration) uint64 {
	t.Helper()
	l := c.await(t, "", d)
	if l.text == "campaigning" {
		l = c.await(t, "leading ", d)
	}
	term, err := strconv.ParseUint(strings.TrimPrefix(l.text, "leading "), 10, 64)
	if !strings.HasPrefix(l.text, "leading ") || err != nil {
		c.fatal(t, fmt.Sprintf("reported %q, want \"leading TERM\"", l.text))
	}
	c.leadAt = l.at
	return term
}

// kill kills c with SIGKILL and waits until it has exited.
func (c *candidate) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatalf("candidate %s: kill: %v", c.name, err)
	}
	go func() {
		for range c.lines { // nothing more is read from it
		}
	}()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("candidate %s (pid %d): still running 30s after SIGKILL", c.name, c.cmd.Process.Pid)
	}
}

// fatal fails t with what c reported on stderr.
func (c *candidate) fatal(t *testing.T, what string) {
	t.Helper()
	exit := ""
	select {
	case <-c.done:
		exit = fmt.Sprintf(" (exit: %v)", c.waited)
	default:
	}
	t.Fatalf("candidate %s (pid %d) %s%s; its stderr:\n%s", c.name, c.cmd.Process.Pid, what, exit, c.stderr.String())
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = w.b[over:]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// percentile returns the q-th quantile of sorted ds by nearest rank
// (with 20 values, q = 0.99 is the largest).
func percentile(ds []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(float64(len(ds))*q)) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// formatTable returns the Markdown table of the results.
func formatTable(cfgs []configuration, results [][]time.Duration, runs int, full bool) string {
	var b bytes.Buffer
	secs := func(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
	fmt.Fprintf(&b, "Leader failover: the leader's process killed with SIGKILL → the next candidate leading (time to its report), "+
		"lease time %v everywhere, %d runs per configuration asked", failoverLease, runs)
	if !full {
		b.WriteString(" (smoke test: configurations in parallel; not figures to publish)")
	}
	fmt.Fprintf(&b, ". p50 and p99 by nearest rank: with 20 runs, p99 is the slowest run. %s %s/%s, %d CPUs.\n\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	b.WriteString("| election | backend | lease time set as | runs | p50 | p99 | fastest |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for i, c := range cfgs {
		ds := slices.Clone(results[i])
		slices.Sort(ds)
		p50, p99, lo := "n/a", "n/a", "n/a"
		if len(ds) > 0 {
			p50, p99, lo = secs(percentile(ds, 0.5)), secs(percentile(ds, 0.99)), secs(ds[0])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s |\n", c.election, c.backend, c.settings, len(ds), p50, p99, lo)
	}
	return b.String()
}
