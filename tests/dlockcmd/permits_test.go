package dlockcmd_test

import (
	"cmp"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// permitsScript logs "start TOKEN PID PPID", runs until the file
// $DIR/stop-PID exists, then logs "end TOKEN PID".
const permitsScript = `echo "start $DLOCK_TOKEN $$ $PPID" >> "$LOG"
while [ ! -e "$DIR/stop-$$" ]; do sleep 0.05; done
echo "end $DLOCK_TOKEN $$" >> "$LOG"`

// TestRunPermits: three dlock run --permits 2 on one key: two commands run
// at once and the third waits until one of them has ended; dlock inspect
// shows both holders and the 2; each permit's DLOCK_TOKEN is larger than
// the tokens granted before it. A dlock run with another number of permits
// fails (125) without waiting, and --shared readers run together while a
// writer (a plain dlock run --try) finds the key held (75).
func TestRunPermits(t *testing.T) {
	for _, b := range electBackends {
		t.Run(b.name, func(t *testing.T) {
			url, key, dir := b.url(t), runKey(t), t.TempDir()
			log := filepath.Join(dir, "log")
			env := []string{"LOG=" + log, "DIR=" + dir}
			var ps []*runProc
			for i := range 3 {
				ps = append(ps, startRun(t, env, "", "run", "--url", url, "--permits", "2", "--holder", "h"+strconv.Itoa(i), key, "--", "sh", "-c", permitsScript))
			}
			starts := electStarts(electWait(t, log, "start", 2, ps...))
			// The two granted at once log their start in either order;
			// inspect lists them by token.
			slices.SortFunc(starts, func(a, b electEvent) int { return cmp.Compare(a.token, b.token) })
			time.Sleep(time.Second) // the third must still wait
			if n := len(electStarts(electLog(t, log))); n != 2 {
				t.Fatalf("%d commands started with 2 permits held; want 2:\n%v", n, electLog(t, log))
			}
			out, errOut, code := runInspect(t, nil, "inspect", "--url", url, key)
			want := regexp.MustCompile(`^KEY ` + regexp.QuoteMeta(key) + ` held by 2 of 2 permits: token ` + strconv.FormatUint(starts[0].token, 10) +
				`, holder h[0-2], [0-9.]+s left; token ` + strconv.FormatUint(starts[1].token, 10) + `, holder h[0-2], [0-9.]+s left(, [01] waiters?)?\n$`)
			if code != 0 || !want.MatchString(out) {
				t.Errorf("dlock inspect = %q, status %d (stderr %q), want a match for %s", out, code, errOut, want)
			}
			_, errOut, code = runDlock(t, nil, "", "run", "--url", url, "--permits", "3", "--wait", "30s", key, "--", "true")
			if code != 125 || !strings.Contains(errOut, "asked for a permit of 3, but the key's holders hold a permit of 2") {
				t.Errorf("dlock run --permits 3 on a semaphore of 2: status %d, stderr %q; want 125 and the two numbers", code, errOut)
			}
			if err := os.WriteFile(filepath.Join(dir, "stop-"+strconv.Itoa(starts[0].pid)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			evs := electWait(t, log, "start", 3, ps...)
			third := electStarts(evs)[2]
			ended := false
			for _, ev := range evs {
				if ev.what == "end" && ev.pid == starts[0].pid && ev.lineNo < third.lineNo {
					ended = true
				}
			}
			if !ended || third.token <= starts[1].token || starts[1].token == starts[0].token {
				t.Errorf("the third command started before the first ended, or the tokens do not increase:\n%v", evs)
			}
			for _, s := range electStarts(evs) { // the one stopped already too: harmless
				if err := os.WriteFile(filepath.Join(dir, "stop-"+strconv.Itoa(s.pid)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range ps {
				if code := p.wait(t); code != 0 {
					t.Errorf("dlock run --permits 2: status %d; stderr:\n%s", code, p.stderr.String())
				}
			}

			// Readers together, the writer refused.
			rw := key + "/rw"
			reader := startRun(t, env, "", "run", "--url", url, "--shared", rw, "--", "sh", "-c", permitsScript)
			r := electStarts(electWait(t, log, "start", 4, reader))[3]
			if _, errOut, code := runDlock(t, nil, "", "run", "--url", url, "--shared", "--try", rw, "--", "true"); code != 0 {
				t.Errorf("a second reader: status %d, stderr %q; want 0", code, errOut)
			}
			if _, errOut, code := runDlock(t, nil, "", "run", "--url", url, "--try", rw, "--", "true"); code != 75 {
				t.Errorf("the writer while a reader runs: status %d, stderr %q; want 75", code, errOut)
			}
			if err := os.WriteFile(filepath.Join(dir, "stop-"+strconv.Itoa(r.pid)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if code := reader.wait(t); code != 0 {
				t.Errorf("dlock run --shared: status %d; stderr:\n%s", code, reader.stderr.String())
			}
			runAssertFree(t, url, rw)
			runAssertFree(t, url, key)
		})
	}
}
