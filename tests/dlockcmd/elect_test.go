package dlockcmd_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// electBackends are the servers dlock run --elect is tested on.
var electBackends = []struct {
	name string
	url  func(*testing.T) string
}{{"redis", runRedisURL}, {"etcd", runEtcdURL}}

// electEvent is one line of the log the tests' commands write: "start
// TOKEN PID PPID" when the command starts (PPID: the dlock that started
// it), "end TOKEN PID" when it exits.
type electEvent struct {
	what      string
	token     uint64
	pid, ppid int
	line      string
	lineNo    int
}

func (ev electEvent) String() string { return ev.line }

// electLog reads the commands' log at path.
func electLog(t *testing.T, path string) []electEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var evs []electEvent
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		ev := electEvent{line: line, lineNo: i + 1}
		var err error
		switch {
		case len(f) == 4 && f[0] == "start":
			ev.what = f[0]
			ev.token, err = strconv.ParseUint(f[1], 10, 64)
			if err == nil {
				ev.pid, err = strconv.Atoi(f[2])
			}
			if err == nil {
				ev.ppid, err = strconv.Atoi(f[3])
			}
		case len(f) == 3 && f[0] == "end":
			ev.what = f[0]
			ev.token, err = strconv.ParseUint(f[1], 10, 64)
			if err == nil {
				ev.pid, err = strconv.Atoi(f[2])
			}
		default:
			err = fmt.Errorf("not a start or an end")
		}
		if err != nil {
			t.Fatalf("the commands' log, line %d %q: %v\n%s", i+1, line, err, b)
		}
		evs = append(evs, ev)
	}
	return evs
}

// electStarts is the log's start events.
func electStarts(evs []electEvent) []electEvent {
	var s []electEvent
	for _, ev := range evs {
		if ev.what == "start" {
			s = append(s, ev)
		}
	}
	return s
}

// electWait polls (up to 30 s) until the log at path has n events of kind
// what, and returns the log. The candidates must not exit meanwhile.
func electWait(t *testing.T, path, what string, n int, ps ...*runProc) []electEvent {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := electLog(t, path)
		count := 0
		for _, ev := range evs {
			if ev.what == what {
				count++
			}
		}
		if count >= n {
			return evs
		}
		for _, p := range ps {
			select {
			case <-p.done:
				t.Fatalf("dlock %d exited (status %d) before the log had %d %s lines; stderr:\n%s", p.cmd.Process.Pid, p.code, n, what, p.stderr.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			var errs strings.Builder
			for _, p := range ps {
				fmt.Fprintf(&errs, "dlock %d's stderr:\n%s", p.cmd.Process.Pid, p.stderr.String())
			}
			t.Fatalf("the log has %d %s lines after 30s, want %d:\n%s%s", count, what, n, b, errs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processGone reports whether process pid has ended: it no longer exists,
// or it is a zombie (dead, not yet reaped by whoever adopted it).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state == 'Z' || state == 'X'
}

// electScript is a long-lived command: it logs its start (term, its PID
// and its parent's, the dlock that started it), runs until killed, and
// logs its end if it gets SIGTERM.
const electScript = `trap 'echo "end $DLOCK_TOKEN $$" >> "$LOG"; exit 0' TERM
echo "start $DLOCK_TOKEN $$ $PPID" >> "$LOG"
while :; do sleep 0.1; done`

// TestElectKillLeader: two dlock run --elect on one key: exactly one
// command runs at a time. The leading dlock is killed (SIGKILL): its
// command dies with it (the parent-death signal), and the other candidate
// takes over with a larger term (DLOCK_TOKEN) within the TTL and some
// slack, after the killed leader's command has ended. SIGTERM then ends
// the new leader's command and the candidate (status 0), which gives the
// lease back.
func TestElectKillLeader(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc (Linux): the command's death is read there")
	}
	for _, b := range electBackends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			key := runKey(t)
			log := filepath.Join(t.TempDir(), "log")
			const ttl = 3 * time.Second
			env := []string{"LOG=" + log}
			cand := map[int]*runProc{}
			for _, name := range []string{"a", "b"} {
				p := startRun(t, env, "", "run", "--elect", "--url", url, "--ttl", ttl.String(), "--grace", "2s",
					"--holder", "candidate-"+name, key, "--", "sh", "-c", electScript)
				cand[p.cmd.Process.Pid] = p
			}
			all := []*runProc{}
			for _, p := range cand {
				all = append(all, p)
			}
			first := electWait(t, log, "start", 1, all...)[0]
			leader := cand[first.ppid]
			if leader == nil {
				t.Fatalf("the first command's parent %d is neither candidate", first.ppid)
			}
			var follower *runProc
			for pid, p := range cand {
				if pid != first.ppid {
					follower = p
				}
			}
			// More than a TTL with both candidates alive: one command.
			time.Sleep(ttl + time.Second)
			if evs := electLog(t, log); len(evs) != 1 {
				t.Fatalf("with the leader alive, the log is %q: want its one start", evs)
			}

			if err := leader.cmd.Process.Kill(); err != nil { // dlock alone, not its command
				t.Fatal(err)
			}
			killed := time.Now()
			if code := leader.wait(t); code != -int(syscall.SIGKILL) {
				t.Errorf("the killed leader's status %d", code)
			}
			// Its command dies with it, before the follower's starts.
			for !processGone(first.pid) {
				if time.Since(killed) > 10*time.Second {
					t.Fatalf("the killed leader's command (pid %d) still runs 10s after its dlock was killed; log:\n%q", first.pid, electLog(t, log))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if evs := electLog(t, log); len(evs) != 1 {
				t.Fatalf("the killed leader's command ended after the next one started: log %q", evs)
			}

			evs := electWait(t, log, "start", 2, follower)
			took := time.Since(killed)
			second := evs[1]
			if len(evs) != 2 || second.what != "start" || second.ppid != follower.cmd.Process.Pid {
				t.Fatalf("log %q: want the follower's start after the leader's", evs)
			}
			if second.token <= first.token {
				t.Errorf("the new leader's term %d is not above the killed leader's %d", second.token, first.token)
			}
			if limit := ttl + 15*time.Second; took > limit {
				t.Errorf("the follower took over %v after the leader was killed; want within the TTL and slack (%v)", took, limit)
			}

			if err := follower.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := follower.wait(t); code != exitOK {
				t.Errorf("the new leader's status after SIGTERM: %d, want 0; stderr:\n%s", code, follower.stderr.String())
			}
			evs = electLog(t, log)
			if len(evs) != 3 || evs[2].what != "end" || evs[2].token != second.token || evs[2].pid != second.pid {
				t.Errorf("log %q: want the new leader's command to end last, on SIGTERM", evs)
			}
			if stderr := follower.stderr.String(); !strings.Contains(stderr, "dlock run: terminated: stopping the command (SIGTERM, SIGKILL after 2s)\n") {
				t.Errorf("the new leader's stderr %q: want the stop reported", stderr)
			}
			runAssertFree(t, url, key)
		})
	}
}

// TestElectCommandExitNewTerm: when the leader's command exits by itself
// (status 3 here), the candidate gives leadership up and the other one is
// elected, with a larger term; neither dlock stops for the command's
// failure, and the commands never overlap.
func TestElectCommandExitNewTerm(t *testing.T) {
	url := runRedisURL(t)
	key := runKey(t)
	log := filepath.Join(t.TempDir(), "log")
	env := []string{"LOG=" + log}
	var ps []*runProc
	for range 2 {
		ps = append(ps, startRun(t, env, "", "run", "--elect", "--url", url, "--ttl", "5s", key, "--", "sh", "-c",
			`trap 'echo "end $DLOCK_TOKEN $$" >> "$LOG"; exit 0' TERM
echo "start $DLOCK_TOKEN $$ $PPID" >> "$LOG"; sleep 0.3; echo "end $DLOCK_TOKEN $$" >> "$LOG"; exit 3`))
	}
	const terms = 4
	evs := electWait(t, log, "end", terms, ps...)
	for _, p := range ps {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		if code := p.wait(t); code != exitOK {
			t.Errorf("status after SIGTERM %d, want 0; stderr:\n%s", code, p.stderr.String())
		}
	}
	evs = electLog(t, log) // with what ran while they stopped
	var last uint64
	leaders := map[int]int{}
	for i := 0; i < len(evs); i += 2 {
		start := evs[i]
		switch {
		case start.what != "start":
			t.Fatalf("log %q: line %d: want a start", evs, start.lineNo)
		case i+1 == len(evs):
			t.Fatalf("log %q: the last command did not end (dlock exited while it ran)", evs)
		}
		end := evs[i+1]
		if end.what != "end" || end.pid != start.pid || end.token != start.token {
			t.Fatalf("log %q: commands overlap: %q follows %q", evs, end.line, start.line)
		}
		if start.token <= last {
			t.Errorf("log %q: terms not increasing", evs)
		}
		last = start.token
		leaders[start.ppid]++
	}
	for _, p := range ps {
		if leaders[p.cmd.Process.Pid] == 0 {
			t.Errorf("log %q: dlock %d never led: the leader that gave up did not let the other take over", evs, p.cmd.Process.Pid)
		}
		if stderr := p.stderr.String(); !strings.Contains(stderr, "dlock run: the command ended (exit status 3) in term ") {
			t.Errorf("stderr %q: want the command's end reported", stderr)
		}
	}
	runAssertFree(t, url, key)
}

// TestElectInspectHolder: dlock inspect shows the holder description of a
// lock taken by dlock run --elect (--holder) and by dlock run (default:
// hostname/pid of the dlock process), on the text line and in --json.
func TestElectInspectHolder(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range electBackends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			for _, c := range []struct {
				name  string
				flags []string
				want  func(p *runProc) string
			}{
				{"elect", []string{"--elect", "--holder", "web 3/elect"}, func(*runProc) string { return "web 3/elect" }},
				{"run", nil, func(p *runProc) string { return host + "/" + strconv.Itoa(p.cmd.Process.Pid) }},
			} {
				t.Run(c.name, func(t *testing.T) {
					key := runKey(t)
					log := filepath.Join(t.TempDir(), "log")
					args := append(append([]string{"run", "--url", url}, c.flags...), key, "--", "sh", "-c", electScript)
					p := startRun(t, []string{"LOG=" + log}, "", args...)
					start := electWait(t, log, "start", 1, p)[0]
					holder := c.want(p)
					shown := holder
					if strings.Contains(holder, " ") {
						shown = strconv.Quote(holder)
					}
					out, errOut, code := runInspect(t, nil, "inspect", "--url", url, key)
					want := regexp.MustCompile(`^KEY ` + regexp.QuoteMeta(key) + ` held by token ` + strconv.FormatUint(start.token, 10) +
						`, holder ` + regexp.QuoteMeta(shown) + `, [0-9.]+s left(, 0 waiters)?\n$`)
					if code != 0 || !want.MatchString(out) {
						t.Errorf("dlock inspect = %q, status %d (stderr %q), want a match for %s", out, code, errOut, want)
					}
					out, errOut, code = runInspect(t, nil, "inspect", "--json", "--url", url, key)
					var got struct {
						Held   bool    `json:"held"`
						Token  uint64  `json:"token"`
						Holder *string `json:"holder"`
					}
					if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
						t.Fatalf("dlock inspect --json = %q, status %d (stderr %q): %v", out, code, errOut, err)
					}
					if !got.Held || got.Token != start.token || got.Holder == nil || *got.Holder != holder {
						t.Errorf("dlock inspect --json = %s, want held by token %d, holder %q", out, start.token, holder)
					}
					if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
					p.wait(t)
					runAssertFree(t, url, key)
				})
			}
		})
	}
}
