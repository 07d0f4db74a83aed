package dlockcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/tests/servers"
)

// runCompareBin runs the built dlock with args and returns its standard
// output, standard error, exit status and the time it took.
func runCompareBin(t *testing.T, env []string, args ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, dlockBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	took = time.Since(start)
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("dlock %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), code, took
}

// compareHold takes a lock on key on url (its own prefix) and returns the
// lease, to show that compare leaves it alone.
func compareHold(t *testing.T, url, key string) *dlock.Lease {
	t.Helper()
	l, err := dlock.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	le, err := l.Acquire(t.Context(), key, &dlock.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return le
}

// compareStillHeld checks that le, taken before a compare run, is held as it
// was: not lost, and the backend still reports its token.
func compareStillHeld(t *testing.T, url string, le *dlock.Lease) {
	t.Helper()
	select {
	case <-le.Done():
		t.Errorf("%s: the lease on %q taken before compare was lost: %v", url, le.Key(), le.Err())
		return
	default:
	}
	l, err := dlock.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Inspect(t.Context(), le.Key())
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Token != 0 && dlock.Token(info.Token) != le.Token() {
		t.Errorf("%s: %q after compare: %+v, want held with token %d", url, le.Key(), info, le.Token())
	}
}

// The JSON output of dlock compare --json (cmpReport and the types under it
// in cmd/dlock/compare.go), as a user's program reads it. TestCompareJSON
// decodes with DisallowUnknownFields, so that the mirror cannot drift from
// compare.go unnoticed.
type cmpReport struct {
	Duration string       `json:"duration"`
	Prefix   string       `json:"prefix"`
	Backends []*cmpResult `json:"backends"`
}

type cmpResult struct {
	URL        string         `json:"url"`
	Guarantees cmpGuarantees  `json:"guarantees"`
	Single     *cmpThroughput `json:"uncontended_1"`
	Many       *cmpThroughput `json:"uncontended_16"`
	Contended  *cmpContended  `json:"contended"`
	Pause      *cmpPause      `json:"pause"`
	NotReached string         `json:"not_reached,omitempty"`
	Errors     []string       `json:"errors,omitempty"`
}

type cmpGuarantees struct {
	Fencing           string `json:"fencing"`
	ClockDependent    bool   `json:"clock_dependent"`
	ToleratedFailures int    `json:"tolerated_failures"`
	FIFO              bool   `json:"fifo"`
	WakesWaiters      bool   `json:"wakes_waiters"`
}

type cmpThroughput struct {
	Workers   int     `json:"workers"`
	Cycles    int     `json:"cycles"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"cycles_per_second"`
}

type cmpContended struct {
	Workers         int      `json:"workers"`
	Acquisitions    int      `json:"acquisitions"`
	Seconds         float64  `json:"seconds"`
	PerSecond       float64  `json:"handoffs_per_second"`
	WaitP50ms       float64  `json:"wait_p50_ms"`
	WaitP99ms       float64  `json:"wait_p99_ms"`
	PerWorker       []int    `json:"per_worker"`
	Spread          *float64 `json:"spread"`
	LeasesChecked   int      `json:"leases_checked"`
	Violations      int      `json:"mutual_exclusion_violations"`
	ViolationDetail []string `json:"violation_details,omitempty"`
}

type cmpPause struct {
	Skipped           string  `json:"skipped,omitempty"`
	TTLSeconds        float64 `json:"ttl_seconds"`
	PausedToken       uint64  `json:"paused_token"`
	NextToken         uint64  `json:"next_token"`
	LateWriteRejected *bool   `json:"late_write_rejected"`
	NextTokenLarger   *bool   `json:"next_token_larger"`
	Note              string  `json:"note,omitempty"`
}

// As in cmd/dlock/compare.go: the contended phase's workers, and the bound
// on the leases its history check covers.
const (
	cmpContendedWorkers = 4
	cmpHistoryCap       = 2000
)

// The workload against Redis and etcd in one run, as JSON: a row
// per URL with sane figures, the pause's late write rejected, no mutual
// exclusion violation, the user's own lock (on the URL's prefix, on the
// key compare uses) untouched, and the run bounded by --duration.
func TestCompareJSON(t *testing.T) {
	redisURL := "redis://" + servers.Redis(t, 1)[0].Addr()
	etcdURL := "etcd://" + strings.Join(servers.Etcd(t, 1).Endpoints(), ",")
	urls := []string{redisURL, etcdURL}
	mine := []*dlock.Lease{compareHold(t, redisURL, "contended"), compareHold(t, etcdURL, "contended")}

	const duration = 12 * time.Second
	out, errOut, code, took := runCompareBin(t, nil, append([]string{"compare", "--json", "--duration", duration.String()}, urls...)...)
	if code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if errOut != "" {
		t.Errorf("standard error is not a terminal, yet compare wrote to it:\n%s", errOut)
	}
	// Bounded: the phases take --duration in all; opening and closing
	// the backends (well under a second each here) come on top.
	if took > duration+20*time.Second {
		t.Errorf("compare --duration %v took %v", duration, took)
	}
	// Every field must be known to the mirror (cmpReport): a field
	// renamed in compare.go fails here instead of reading as zero.
	var rep cmpReport
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("--json output does not parse into the mirror of its types: %v\n%s", err, out)
	}
	if rep.Prefix != "dlock-compare" || rep.Duration != duration.String() {
		t.Errorf("prefix %q, duration %q", rep.Prefix, rep.Duration)
	}
	if len(rep.Backends) != len(urls) {
		t.Fatalf("%d backends in the report, want %d:\n%s", len(rep.Backends), len(urls), out)
	}
	wantFencing := map[string]string{redisURL: "best-effort", etcdURL: "consensus"}
	for i, r := range rep.Backends {
		if r.URL != urls[i] {
			t.Errorf("row %d is %q, want %q", i, r.URL, urls[i])
		}
		if r.Guarantees.Fencing != wantFencing[urls[i]] {
			t.Errorf("%s: fencing %q, want %q", r.URL, r.Guarantees.Fencing, wantFencing[urls[i]])
		}
		if len(r.Errors) > 0 {
			t.Errorf("%s: errors %q", r.URL, r.Errors)
		}
		if r.Single == nil || r.Many == nil || r.Contended == nil || r.Pause == nil || r.NotReached != "" {
			t.Errorf("%s: a phase not measured: %s", r.URL, out)
			continue
		}
		for _, tp := range []*cmpThroughput{r.Single, r.Many} {
			if tp.Cycles <= 0 || tp.PerSecond <= 0 || tp.Seconds <= 0 {
				t.Errorf("%s: uncontended, %d workers: %+v, want cycles done", r.URL, tp.Workers, tp)
			}
		}
		if r.Single.Workers != 1 || r.Many.Workers != 16 {
			t.Errorf("%s: workers %d and %d, want 1 and 16", r.URL, r.Single.Workers, r.Many.Workers)
		}
		c := r.Contended
		sum := 0
		for _, n := range c.PerWorker {
			sum += n
		}
		if c.Workers != cmpContendedWorkers || len(c.PerWorker) != c.Workers || sum != c.Acquisitions || c.Acquisitions < c.Workers {
			t.Errorf("%s: contended %+v: want %d workers whose acquisitions add up", r.URL, c, cmpContendedWorkers)
		}
		if c.WaitP50ms < 0 || c.WaitP99ms < c.WaitP50ms {
			t.Errorf("%s: wait p50 %vms, p99 %vms", r.URL, c.WaitP50ms, c.WaitP99ms)
		}
		if c.Spread != nil && *c.Spread < 1 {
			t.Errorf("%s: spread %v < 1", r.URL, *c.Spread)
		}
		if c.Violations != 0 || c.LeasesChecked <= 0 || c.LeasesChecked > min(c.Acquisitions, cmpHistoryCap) {
			t.Errorf("%s: mutual exclusion: %d violations (%q) in %d leases checked of %d", r.URL, c.Violations, c.ViolationDetail, c.LeasesChecked, c.Acquisitions)
		}
		p := r.Pause
		if p.Skipped != "" || p.LateWriteRejected == nil || !*p.LateWriteRejected || p.NextTokenLarger == nil || !*p.NextTokenLarger ||
			p.NextToken <= p.PausedToken || p.PausedToken == 0 {
			t.Errorf("%s: pause %+v, want the late write rejected and a larger next token", r.URL, p)
		}
	}
	for i, le := range mine {
		compareStillHeld(t, urls[i], le)
	}
}

// The table: a header and a row per backend, in order (the URLs given,
// --url, then --purpose's), with the declared guarantees; a short
// --duration skips etcd's pause (its TTL is at least 1s) and says so.
func TestCompareTable(t *testing.T) {
	redisURL := "redis://" + servers.Redis(t, 1)[0].Addr()
	etcdURL := "etcd://" + strings.Join(servers.Etcd(t, 1).Endpoints(), ",")
	out, errOut, code, _ := runCompareBin(t, []string{"DLOCK_EFFICIENCY_URL=" + redisURL},
		"compare", "--duration", "3s", "--prefix", "dlock-compare-table", "--url", etcdURL, "--purpose", "efficiency", "mem://")
	if code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "BACKEND ") || !strings.Contains(lines[0], "MUTUAL EXCLUSION") {
		t.Fatalf("no header:\n%s", out)
	}
	for i, want := range []struct{ url, fencing, clock string }{
		{"mem://", "consensus", "no"}, {etcdURL, "consensus", "no"}, {redisURL, "best-effort", "yes"},
	} {
		f := strings.Fields(lines[1+i])
		if len(f) < 13 || f[0] != want.url || f[1] != want.fencing || f[2] != want.clock {
			t.Errorf("row %d: %q, want %s %s %s ...", i+1, lines[1+i], want.url, want.fencing, want.clock)
			continue
		}
		if f[len(f)-3] != "ok" || !strings.Contains(lines[1+i], "leases)") {
			t.Errorf("row %d: mutual exclusion not ok: %q", i+1, lines[1+i])
		}
	}
	if !strings.Contains(out, etcdURL+": pause skipped: needs --duration") {
		t.Errorf("no note on etcd's skipped pause:\n%s", out)
	}
}

// A key space with a lock in it is refused, naming the key, and the lock
// is left alone.
func TestCompareRefusesNonEmptyKeySpace(t *testing.T) {
	redisAddr := servers.Redis(t, 1)[0].Addr()
	etcdURL := "etcd://" + strings.Join(servers.Etcd(t, 1).Endpoints(), ",")
	for _, tc := range []struct{ url, userURL string }{
		{"redis://" + redisAddr, "redis://" + redisAddr + "?prefix=busy:"},
		{etcdURL, etcdURL + "/busy"},
	} {
		le := compareHold(t, tc.userURL, "orders/42")
		out, errOut, code, _ := runCompareBin(t, nil, "compare", "--duration", "2s", "--prefix", "busy", "mem://", tc.url)
		if code != 1 {
			t.Errorf("%s: exit status %d, want 1\nstdout:\n%s\nstderr:\n%s", tc.url, code, out, errOut)
		}
		if out != "" || !strings.Contains(errOut, "refusing to run") || !strings.Contains(errOut, "orders/42") || !strings.Contains(errOut, `"busy"`) {
			t.Errorf("%s: want a refusal naming the key and the prefix on stderr only; stdout:\n%s\nstderr:\n%s", tc.url, out, errOut)
		}
		compareStillHeld(t, tc.userURL, le)
	}
}

// SIGINT ends the run early: exit 1, the figures so far, and no lock left
// held under the prefix (a new run would not be refused). The phases that
// never ran are shown as not measured ("-" in the table, null in JSON), not
// as 0, and the backend never reached is listed as such (issue 22).
func TestCompareInterrupt(t *testing.T) {
	redisURL := "redis://" + servers.Redis(t, 1)[0].Addr()
	for _, asJSON := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "json"}[asJSON], func(t *testing.T) {
			prefix := "dlock-compare-int-" + strconv.FormatBool(asJSON)
			args := []string{"compare", "--duration", "60s", "--prefix", prefix}
			if asJSON {
				args = append(args, "--json")
			}
			out, errOut := compareInterrupted(t, redisURL, prefix, append(args, redisURL, "mem://")...)
			if !strings.Contains(errOut, "dlock compare: interrupted: the figures are partial") {
				t.Errorf("stderr:\n%s", errOut)
			}
			// The interrupt comes in the first phase (the pause) of the
			// first backend, or at worst in the second (1 worker): the
			// 16 workers' and the contended phases never ran.
			if asJSON {
				var rep struct{ Backends []map[string]any }
				if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Backends) != 2 {
					t.Fatalf("want a report with 2 backends (%v); stdout:\n%s", err, out)
				}
				r, m := rep.Backends[0], rep.Backends[1]
				if r["url"] != redisURL || r["uncontended_16"] != nil || r["contended"] != nil || r["not_reached"] != nil {
					t.Errorf("%s: want the phases that never ran null, and it reached; stdout:\n%s", redisURL, out)
				}
				if m["url"] != "mem://" || m["not_reached"] != "interrupted" || m["uncontended_1"] != nil || m["pause"] != nil {
					t.Errorf("mem://: want it not reached, nothing measured; stdout:\n%s", out)
				}
				return
			}
			lines := strings.Split(out, "\n")
			if len(lines) < 3 || !strings.HasPrefix(lines[0], "BACKEND ") {
				t.Fatalf("want the table; stdout:\n%s", out)
			}
			f := strings.Fields(lines[1])
			// BACKEND FENCING CLOCK-DEPENDENT TOLERATES 1 WORKER/s 16 WORKERS/s
			// HANDOFFS/s WAIT p50 WAIT p99 SPREAD LATE WRITE NEXT TOKEN MUTUAL EXCLUSION
			if len(f) != 13 || f[0] != redisURL || f[5] != "-" || f[6] != "-" || f[7] != "-" || f[12] != "-" {
				t.Errorf("row %q: want %s with '-' for 16 workers, handoffs, waits and mutual exclusion; stdout:\n%s", lines[1], redisURL, out)
			}
			if f := strings.Fields(lines[2]); len(f) != 13 || f[0] != "mem://" || f[4] != "-" || f[12] != "-" {
				t.Errorf("row %q: want mem:// with nothing measured; stdout:\n%s", lines[2], out)
			}
			if !strings.Contains(out, "\nmem://: not reached: interrupted\n") {
				t.Errorf("no note that mem:// was not reached; stdout:\n%s", out)
			}
		})
	}
}

// compareInterrupted runs the built dlock with args, sends it SIGINT once
// the workload holds a lock on url under prefix, and returns its standard
// output and error once it has exited, with status 1, and left no key
// under the prefix.
func compareInterrupted(t *testing.T, url, prefix string, args ...string) (stdout, stderr string) {
	t.Helper()
	probe, err := dlock.Open(t.Context(), url+"?prefix="+prefix+":")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()

	cmd := exec.Command(dlockBinary(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
	}()
	// Interrupt once the workload holds a lock under the prefix.
	for deadline := time.Now().Add(30 * time.Second); ; {
		keys, err := driver.Keys(t.Context(), probe, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no key under the prefix within 30s\nstdout:\n%s\nstderr:\n%s", o.String(), e.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		exited = true
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("after SIGINT: %v, want exit status 1", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGINT (--duration 60s)\nstderr:\n%s", e.String())
	}
	if keys, err := driver.Keys(t.Context(), probe, 10); err != nil || len(keys) > 0 {
		t.Errorf("keys under the prefix after the interrupted run: %q, %v; want none", keys, err)
	}
	return o.String(), e.String()
}

// The keys compare names when it refuses a busy key space are quoted: a
// key planted with an escape sequence (here one that clears the screen)
// reaches the terminal as text, never as raw control bytes (issue 21,
// finding 9).
func TestCompareQuotesKeys(t *testing.T) {
	redisAddr := servers.Redis(t, 1)[0].Addr()
	const key = "planted\x1b[2J\x1b[Hkey"
	le := compareHold(t, "redis://"+redisAddr+"?prefix=esc:", key)
	out, errOut, code, _ := runCompareBin(t, nil, "compare", "--duration", "2s", "--prefix", "esc", "redis://"+redisAddr)
	if code != 1 || !strings.Contains(errOut, "refusing to run") {
		t.Fatalf("exit status %d, want 1 and a refusal\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if strings.ContainsRune(out+errOut, 0x1b) {
		t.Errorf("the output holds a raw ESC byte: %q", out+errOut)
	}
	if want := `"planted\x1b[2J\x1b[Hkey"`; !strings.Contains(errOut, want) {
		t.Errorf("stderr %q does not name the key quoted, %s", errOut, want)
	}
	compareStillHeld(t, "redis://"+redisAddr+"?prefix=esc:", le)
}
