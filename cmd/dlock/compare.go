package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/fence"
)

func init() {
	register(&command{name: "compare", short: "run one workload against each backend and print a table", run: runCompare})
}

const compareUsage = `usage: dlock compare [flags] [URL...]

Compare runs one standard workload against each backend named by a URL
(dlock.Open's URLs: redis://, redlock://, etcd://, zk://, mem://) and
prints a table, one row per backend, with the guarantees the backend
declares beside what was observed. The backends are the URLs given, and
--url; with none of those, $DLOCK_URL; --purpose adds the URL configured
for that purpose ($DLOCK_CORRECTNESS_URL or $DLOCK_EFFICIENCY_URL), which
is refused if the backend cannot serve it. The workload:

	uncontended acquire/release cycles per second, with 1 and 16 workers
	contended handoffs on one key (4 workers, each with its own Locker):
	  handoffs per second, acquire wait p50 and p99, and the spread
	  (most acquisitions of one worker / fewest)
	a pause: a holder stops refreshing and sleeps past its TTL, the next
	  holder takes the lock and writes to a fenced register (fence.Guard),
	  then the paused holder's late write: was it rejected, and was the
	  next holder's token larger?
	mutual exclusion: the contended phase's history, checked by
	  conformance/check (violations found, leases checked)

The whole run takes about --duration, split across the backends and
their phases, plus the time to open and close them. A progress line is
shown on standard error when it is a terminal. Interrupted (^C or
SIGTERM), compare stops, releases every lease and prints the figures so
far: a phase that never ran is "-" (null in --json), and a backend never
reached is listed as such ("not reached: interrupted").

Compare never touches keys outside --prefix: it rewrites each URL so that
every key lives under it (the prefix parameter of redis and redlock URLs,
as PREFIX:, and the path of etcd and zk URLs; mem:// stores are private
to the process), and it refuses to run, naming the keys it found (quoted,
as Go strings), if a backend already has keys under the prefix.

Exit status: 0 when every backend was measured, 1 when a backend could
not be opened, had keys under the prefix, or failed during the run, 2 for
a usage error.

Flags:
`

// The contended phase's workers, each with its own Locker.
const cmpContendedWorkers = 4

// cmpHistoryCap bounds the leases of the contended phase recorded for the
// history check, whose cost grows with the square of their number; the
// acquisitions after them are counted but not checked.
const cmpHistoryCap = 2000

// cmpKeysLimit is how many keys the key-space check asks for (and names).
const cmpKeysLimit = 10

func runCompare(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet("compare", compareUsage)
	duration := fs.Duration("duration", 10*time.Second, "total time of the workload, split across backends and phases")
	prefix := fs.String("prefix", "dlock-compare", "key prefix for every key the workload uses")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	rawURL, purpose := backendFlags(fs)
	if status, ok := parseFlags(e, "compare", fs, args); !ok {
		return status
	}
	usageErr := func(format string, a ...any) int { return usageFail(e, "compare", format, a...) }
	if *duration <= 0 {
		return usageErr("--duration must be positive, got %v", *duration)
	}
	p := strings.Trim(*prefix, "/:")
	if p == "" {
		return usageErr("--prefix must not be empty")
	}
	var targets []*cmpTarget
	add := func(raw, purpose string) int {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme == "" {
			return usageErr("bad URL %q: want scheme://...", redacted(raw))
		}
		ru, err := cmpUnderPrefix(u, p)
		if err != nil {
			return usageErr("%v", err)
		}
		targets = append(targets, &cmpTarget{name: redacted(raw), url: ru, purpose: purpose})
		return exitOK
	}
	raws := fs.Args()
	if *rawURL != "" {
		raws = append(raws, *rawURL)
	}
	if len(raws) == 0 && *purpose == "" && e.getenv(envURL) != "" {
		raws = append(raws, e.getenv(envURL))
	}
	for _, raw := range raws {
		if code := add(raw, ""); code != exitOK {
			return code
		}
	}
	if *purpose != "" {
		name := map[string]string{string(dlock.Correctness): envCorrectness, string(dlock.Efficiency): envEfficiency}[*purpose]
		switch {
		case name == "":
			return usageErr("--purpose %q: want %q or %q", *purpose, dlock.Correctness, dlock.Efficiency)
		case e.getenv(name) == "":
			return usageErr("--purpose %s: $%s is not set", *purpose, name)
		}
		if code := add(e.getenv(name), *purpose); code != exitOK {
			return code
		}
	}
	if len(targets) == 0 {
		return usageErr("no backend: give URLs, --url URL, set $%s, or use --purpose", envURL)
	}

	// The workload cuts acquires short at each phase's end and releases
	// the paused holder's expired lease: the clients' warnings about those
	// are expected, so only errors are logged (the Lockers take the
	// default logger when they are opened).
	// ^C (or SIGTERM) ends the run early: the phases stop, every lease is
	// released (nothing is left held under the prefix to refuse the next
	// run), and the figures so far are printed.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	prevLog := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	defer slog.SetDefault(prevLog)

	pr := newCmpProgress(e.stderr)
	defer pr.done()
	// Open every backend and check its key space before any workload runs.
	defer func() {
		for _, t := range targets {
			t.close()
		}
	}()
	for _, t := range targets {
		pr.show("opening %s", t.name)
		if err := t.open(ctx, e); err != nil {
			pr.done()
			fmt.Fprintf(e.stderr, "dlock compare: %s\n", printable(err.Error()))
			if isUsage(err) {
				return exitUsage
			}
			return exitFailure
		}
		keys, err := t.keys(ctx)
		if err != nil {
			pr.done()
			fmt.Fprintf(e.stderr, "dlock compare: %s: listing the keys under %q: %s\n", t.name, p, printable(err.Error()))
			return exitFailure
		}
		if len(keys) > 0 {
			pr.done()
			more := ""
			if len(keys) >= cmpKeysLimit {
				more = ", ..."
			}
			// Quoted: the keys are the server's, and may hold anything,
			// escape sequences for the terminal included.
			quoted := make([]string, len(keys))
			for i, k := range keys {
				quoted[i] = strconv.Quote(k)
			}
			fmt.Fprintf(e.stderr, "dlock compare: %s: refusing to run: the key space under prefix %q is not empty (%s%s); choose another --prefix\n",
				t.name, p, strings.Join(quoted, ", "), more)
			return exitFailure
		}
	}

	per := *duration / time.Duration(len(targets))
	var results []*cmpResult
	failed := false
	for i, t := range targets {
		if ctx.Err() != nil {
			r := t.result()
			r.NotReached = "interrupted"
			results = append(results, r)
			continue
		}
		r := t.run(ctx, per, len(targets), func(phase string) {
			pr.show("[%d/%d] %s: %s", i+1, len(targets), t.name, phase)
		})
		results = append(results, r)
		if len(r.Errors) > 0 {
			failed = true
		}
	}
	pr.done()
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(cmpReport{Duration: duration.String(), Prefix: p, Backends: results})
	} else {
		cmpPrintTable(e.stdout, results)
	}
	for _, r := range results {
		for _, msg := range r.Errors {
			fmt.Fprintf(e.stderr, "dlock compare: %s: %s\n", r.URL, msg)
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(e.stderr, "dlock compare: interrupted: the figures are partial")
		return exitFailure
	}
	if failed {
		return exitFailure
	}
	return exitOK
}

// cmpUnderPrefix returns u with the backend's key prefix set to prefix.
func cmpUnderPrefix(u *url.URL, prefix string) (*url.URL, error) {
	r := *u
	switch u.Scheme {
	case "redis", "rediss", "redlock", "redlocks":
		q := r.Query()
		q.Set("prefix", prefix+":")
		r.RawQuery = q.Encode()
	case "etcd", "etcds", "zk", "zks":
		r.Path, r.RawPath = "/"+prefix, ""
	case "mem":
		// A mem:// store lives in this process: nobody else's keys are in it.
	default:
		return nil, fmt.Errorf("%s: cannot put the keys of a %s:// backend under --prefix (compare knows redis, rediss, redlock, redlocks, etcd, etcds, zk, zks and mem)", u.Redacted(), u.Scheme)
	}
	return &r, nil
}

// cmpReport is the JSON output.
type cmpReport struct {
	Duration string       `json:"duration"`
	Prefix   string       `json:"prefix"`
	Backends []*cmpResult `json:"backends"`
}

// cmpResult is one backend's row. A phase that never ran (the run was
// interrupted before it) is nil: not measured, "-" in the table, null in
// JSON.
type cmpResult struct {
	URL        string         `json:"url"`
	Guarantees cmpGuarantees  `json:"guarantees"`
	Single     *cmpThroughput `json:"uncontended_1"`
	Many       *cmpThroughput `json:"uncontended_16"`
	Contended  *cmpContended  `json:"contended"`
	Pause      *cmpPause      `json:"pause"`
	// NotReached says why the workload never ran on the backend
	// ("interrupted"); "" if it did.
	NotReached string   `json:"not_reached,omitempty"`
	Errors     []string `json:"errors,omitempty"`
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
	Workers      int     `json:"workers"`
	Acquisitions int     `json:"acquisitions"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"handoffs_per_second"`
	WaitP50ms    float64 `json:"wait_p50_ms"`
	WaitP99ms    float64 `json:"wait_p99_ms"`
	PerWorker    []int   `json:"per_worker"`
	// Spread is most/fewest acquisitions per worker; nil if a worker got none.
	Spread *float64 `json:"spread"`
	// MutualExclusion is the history check: leases checked, violations.
	LeasesChecked   int      `json:"leases_checked"`
	Violations      int      `json:"mutual_exclusion_violations"`
	ViolationDetail []string `json:"violation_details,omitempty"`
}

type cmpPause struct {
	// Skipped says why the scenario did not run ("" if it ran).
	Skipped     string  `json:"skipped,omitempty"`
	TTLSeconds  float64 `json:"ttl_seconds"`
	PausedToken uint64  `json:"paused_token"`
	NextToken   uint64  `json:"next_token"`
	// LateWriteRejected and NextTokenLarger are nil where they could not
	// be observed (no tokens, or no next holder).
	LateWriteRejected *bool  `json:"late_write_rejected"`
	NextTokenLarger   *bool  `json:"next_token_larger"`
	Note              string `json:"note,omitempty"`
}

// cmpTarget is one backend: the URL asked for and the Lockers on it.
type cmpTarget struct {
	name    string          // the URL as given, password redacted
	url     *url.URL        // the URL with the keys under --prefix
	purpose string          // the purpose it is opened for ("" for none)
	lockers []*dlock.Locker // [0] the main one, then one per contended worker
}

func (t *cmpTarget) open(ctx context.Context, e *env) error {
	raw := t.url.String()
	if t.purpose != "" {
		// openLocker reads the purpose's URL from the environment: give it
		// the one rewritten under --prefix.
		inner, rewritten := e, raw
		e = &env{stdin: inner.stdin, stdout: inner.stdout, stderr: inner.stderr, getenv: func(k string) string {
			if k == envCorrectness || k == envEfficiency {
				return rewritten
			}
			return inner.getenv(k)
		}}
		raw = ""
	}
	for range 1 + cmpContendedWorkers {
		l, err := openLocker(ctx, e, raw, t.purpose)
		if err != nil {
			return err
		}
		t.lockers = append(t.lockers, l)
	}
	return nil
}

func (t *cmpTarget) close() {
	for _, l := range t.lockers {
		l.Close()
	}
	t.lockers = nil
}

// keys returns up to cmpKeysLimit keys held or waited for under the
// target's prefix.
func (t *cmpTarget) keys(ctx context.Context) ([]string, error) {
	return driver.Keys(ctx, t.lockers[0], cmpKeysLimit)
}

// result is t's row before any phase has run: the guarantees it declares,
// nothing measured.
func (t *cmpTarget) result() *cmpResult {
	g := t.lockers[0].Guarantees()
	return &cmpResult{URL: t.name, Guarantees: cmpGuarantees{
		Fencing: g.Fencing.String(), ClockDependent: g.ClockDependent, ToleratedFailures: g.ToleratedFailures,
		FIFO: g.FIFO, WakesWaiters: g.WakesWaiters,
	}}
}

// run runs the workload on t within about budget (the --duration's share
// of each of n backends). phase is told of each phase as it starts. Once
// ctx ends (an interrupt), no other phase starts: those left are nil.
func (t *cmpTarget) run(ctx context.Context, budget time.Duration, n int, phase func(string)) *cmpResult {
	l := t.lockers[0]
	r := t.result()
	fail := func(what string, err error) { r.Errors = append(r.Errors, what+": "+printable(err.Error())) }

	// The pause runs first: it takes a little more than the shortest TTL
	// the backend grants, and may take up to two thirds of the budget (it
	// is skipped if that is less than 1.5 TTLs). The other phases share
	// what is left.
	start := time.Now()
	ttl := cmpPauseTTL(l.Limits())
	if pauseBudget := min(3*ttl+2*time.Second, budget*2/3); pauseBudget >= 3*ttl/2 {
		phase("pause past the TTL")
		r.Pause = cmpPauseScenario(ctx, l, t.lockers[1], ttl, pauseBudget, fail)
	} else {
		r.Pause = &cmpPause{TTLSeconds: ttl.Seconds(),
			Skipped: fmt.Sprintf("needs --duration %v or more for %d backend(s) (the TTL is %v)", time.Duration(n)*9*ttl/4, n, ttl)}
	}
	rest := max(budget-time.Since(start), 0)

	if ctx.Err() != nil {
		return r
	}
	phase("uncontended, 1 worker")
	single := cmpCycles(ctx, l, 1, rest/4, fail)
	r.Single = &single
	if ctx.Err() != nil {
		return r
	}
	phase("uncontended, 16 workers")
	many := cmpCycles(ctx, l, 16, rest/4, fail)
	r.Many = &many
	if ctx.Err() != nil {
		return r
	}
	phase("contended")
	c := cmpContend(ctx, t.lockers[1:], rest/2, fail)
	r.Contended = &c
	return r
}

// cmpPauseTTL is the TTL of the pause scenario: the shortest the backend
// grants, at least 100ms, rounded up to its resolution.
func cmpPauseTTL(lim dlock.Limits) time.Duration {
	ttl := max(lim.MinTTL, lim.MinGrant, 100*time.Millisecond)
	if r := lim.Resolution; r > 0 && ttl%r != 0 {
		ttl = (ttl/r + 1) * r
	}
	return ttl
}

// cmpReleaseTimeout bounds a release made after a phase's deadline.
const cmpReleaseTimeout = 5 * time.Second

func cmpRelease(le interface{ Release(context.Context) error }) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmpReleaseTimeout)
	defer cancel()
	return le.Release(ctx)
}

// cmpCycles runs workers goroutines, each acquiring and releasing its own key
// until d has passed, and returns the cycles completed.
func cmpCycles(ctx context.Context, l *dlock.Locker, workers int, d time.Duration, fail func(string, error)) cmpThroughput {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		mu    sync.Mutex
		total int
		wg    sync.WaitGroup
	)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("cycle/%d/%d", workers, w)
			n := 0
			defer func() { mu.Lock(); total += n; mu.Unlock() }()
			for ctx.Err() == nil {
				le, err := l.Acquire(ctx, key, nil)
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Sprintf("uncontended acquire of %q", key), err)
						cancel()
					}
					return
				}
				if err := cmpRelease(le); err != nil {
					fail(fmt.Sprintf("uncontended release of %q", key), err)
					cancel()
					return
				}
				n++
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	return cmpThroughput{Workers: workers, Cycles: total, Seconds: cmpRound(secs, 2), PerSecond: cmpRound(float64(total)/secs, 0)}
}

// cmpContend has one worker per Locker acquire and release one key until d
// has passed, recording the history, and checks mutual exclusion on it.
func cmpContend(ctx context.Context, lockers []*dlock.Locker, d time.Duration, fail func(string, error)) cmpContended {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	const key = "contended"
	h := check.NewHistory()
	var (
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
	)
	per := make([]int, len(lockers))
	var recorded atomic.Int64
	start := time.Now()
	for w, l := range lockers {
		wg.Go(func() {
			client := fmt.Sprintf("worker %d", w)
			for ctx.Err() == nil {
				t0 := time.Now()
				var le interface{ Release(context.Context) error }
				var err error
				if recorded.Add(1) <= cmpHistoryCap {
					le, err = h.Acquire(ctx, client, l, key, nil)
				} else {
					le, err = l.Acquire(ctx, key, nil)
				}
				if err != nil {
					if ctx.Err() == nil {
						fail("contended acquire", err)
						cancel()
					}
					return
				}
				wait := time.Since(t0)
				err = cmpRelease(le)
				mu.Lock()
				waits = append(waits, wait)
				per[w]++
				mu.Unlock()
				if err != nil {
					fail("contended release", err)
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	c := cmpContended{Workers: len(lockers), Acquisitions: len(waits), Seconds: cmpRound(secs, 2),
		PerSecond: cmpRound(float64(len(waits))/secs, 0), PerWorker: per}
	slices.Sort(waits)
	c.WaitP50ms = cmpMs(cmpQuantile(waits, 0.50))
	c.WaitP99ms = cmpMs(cmpQuantile(waits, 0.99))
	if lo, hi := slices.Min(per), slices.Max(per); lo > 0 {
		s := cmpRound(float64(hi)/float64(lo), 2)
		c.Spread = &s
	}
	for _, op := range h.Ops() {
		if op.Granted() {
			c.LeasesChecked++
		}
	}
	for _, v := range check.Check(h, check.Options{}) {
		if v.Property == check.MutualExclusion {
			c.Violations++
			if len(c.ViolationDetail) < 3 {
				c.ViolationDetail = append(c.ViolationDetail, v.Detail)
			}
		}
	}
	return c
}

// cmpPauseScenario: a holder on l takes a lease of ttl without refreshing it
// and pauses past the TTL; a holder on next takes the lock and writes to a
// fenced register; then the paused holder writes late. It returns nil if
// ctx ended (an interrupt) before the scenario could tell its outcome.
func cmpPauseScenario(parent context.Context, l, next *dlock.Locker, ttl, d time.Duration, fail func(string, error)) *cmpPause {
	ctx, cancel := context.WithTimeout(parent, d)
	defer cancel()
	const key, resource = "pause", "register"
	p := &cmpPause{TTLSeconds: ttl.Seconds()}
	var guard fence.Guard
	write := func(tok dlock.Token) error { return guard.Do(resource, tok, func() error { return nil }) }

	a, err := l.Acquire(ctx, key, &dlock.AcquireOptions{TTL: ttl})
	if err != nil {
		if parent.Err() != nil {
			return nil
		}
		fail("pause: first acquire", err)
		return p
	}
	defer cmpRelease(a) // refused by now (the lease has ended); nothing to undo
	p.TTLSeconds = a.TTL().Seconds()
	p.PausedToken = uint64(a.Token())
	if a.Token() == 0 {
		p.Note = "the backend issues no fencing tokens"
		return p
	}
	if err := write(a.Token()); err != nil {
		fail("pause: first write", err)
		return p
	}
	// The holder pauses: no refresh, no release. The next holder waits.
	pausedAt := time.Now()
	b, err := next.Acquire(ctx, key, nil)
	if err != nil {
		if parent.Err() != nil {
			return nil
		}
		if ctx.Err() != nil {
			p.Note = fmt.Sprintf("the next holder was not granted the lock within %v", d.Round(time.Millisecond))
		} else {
			fail("pause: next holder's acquire", err)
		}
		return p
	}
	defer cmpRelease(b)
	p.NextToken = uint64(b.Token())
	larger := b.Token() > a.Token()
	p.NextTokenLarger = &larger
	if err := write(b.Token()); err != nil && !errors.Is(err, fence.ErrStaleToken) {
		fail("pause: next holder's write", err)
		return p
	}
	// The paused holder wakes past its TTL and writes with its old token.
	if left := time.Until(pausedAt.Add(a.TTL() + ttl/10)); left > 0 {
		select {
		case <-time.After(left):
		case <-parent.Done():
			return nil
		}
	}
	err = write(a.Token())
	rejected := errors.Is(err, fence.ErrStaleToken)
	p.LateWriteRejected = &rejected
	return p
}

func cmpQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func cmpMs(d time.Duration) float64 { return cmpRound(float64(d)/float64(time.Millisecond), 4) }

func cmpRound(x float64, places int) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', places, 64), 64)
	return v
}

// cmpPrintTable prints results as a table, then notes: skipped pauses,
// mutual exclusion violations, backends not reached. What was not
// measured is "-".
func cmpPrintTable(w io.Writer, results []*cmpResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tFENCING\tCLOCK-DEPENDENT\tTOLERATES\t1 WORKER/s\t16 WORKERS/s\tHANDOFFS/s\tWAIT p50\tWAIT p99\tSPREAD\tLATE WRITE\tNEXT TOKEN\tMUTUAL EXCLUSION")
	perSecond := func(tp *cmpThroughput) string {
		if tp == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f", tp.PerSecond)
	}
	for _, r := range results {
		g, c, p := r.Guarantees, r.Contended, r.Pause
		handoffs, p50, p99, spread, mutex := "-", "-", "-", "-", "-"
		if c != nil {
			handoffs = fmt.Sprintf("%.0f", c.PerSecond)
			if c.Acquisitions > 0 {
				p50, p99 = cmpFmtMs(c.WaitP50ms), cmpFmtMs(c.WaitP99ms)
			}
			if c.Spread != nil {
				spread = fmt.Sprintf("%.2f", *c.Spread)
			} else if c.Acquisitions > 0 {
				spread = "starved"
			}
			mutex = fmt.Sprintf("ok (%d leases)", c.LeasesChecked)
			if c.Violations > 0 {
				mutex = fmt.Sprintf("%d VIOLATIONS", c.Violations)
			}
		}
		late, tok := "-", "-"
		switch {
		case p == nil:
		case p.Skipped != "":
			late, tok = "skipped", "skipped"
		case p.Note != "" && p.LateWriteRejected == nil:
			late = "n/a"
		}
		if p != nil && p.LateWriteRejected != nil {
			late = map[bool]string{true: "rejected", false: "ACCEPTED"}[*p.LateWriteRejected]
		}
		if p != nil && p.NextTokenLarger != nil {
			tok = map[bool]string{true: "larger", false: "NOT LARGER"}[*p.NextTokenLarger]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.URL, g.Fencing, cmpYesNo(g.ClockDependent), g.ToleratedFailures,
			perSecond(r.Single), perSecond(r.Many), handoffs,
			p50, p99, spread, late, tok, mutex)
	}
	tw.Flush()
	var notes []string
	for _, r := range results {
		switch {
		case r.NotReached != "":
			notes = append(notes, fmt.Sprintf("%s: not reached: %s", r.URL, r.NotReached))
		case r.Pause == nil:
		case r.Pause.Skipped != "":
			notes = append(notes, fmt.Sprintf("%s: pause skipped: %s", r.URL, r.Pause.Skipped))
		case r.Pause.Note != "":
			notes = append(notes, fmt.Sprintf("%s: pause: %s", r.URL, r.Pause.Note))
		}
		if r.Contended != nil {
			for _, d := range r.Contended.ViolationDetail {
				notes = append(notes, fmt.Sprintf("%s: mutual exclusion: %s", r.URL, d))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}

func cmpYesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func cmpFmtMs(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.0fµs", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2fms", v)
	default:
		return fmt.Sprintf("%.0fms", v)
	}
}

// cmpProgress is a line on standard error, rewritten in place, shown only
// when standard error is a terminal.
type cmpProgress struct {
	w     io.Writer // nil: not a terminal
	shown bool
}

func newCmpProgress(w io.Writer) *cmpProgress {
	f, ok := w.(*os.File)
	if !ok {
		return &cmpProgress{}
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return &cmpProgress{}
	}
	return &cmpProgress{w: w}
}

func (p *cmpProgress) show(format string, a ...any) {
	if p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "\r\033[Kdlock compare: "+format, a...)
	p.shown = true
}

func (p *cmpProgress) done() {
	if p.w != nil && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}
