package readme

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSharedExampleRuns runs the README's semaphore and read-write lock
// program as its text says: three copies at once against `dlock serve`.
// Two hold an import permit together (dlock inspect shows 2 of 2 permits),
// the third only after one has given its permit back (each holds it for
// 2 s), and every copy then reads and writes the config, with a token of
// its own for every grant.
func TestSharedExampleRuns(t *testing.T) {
	prog, _, env := exampleAgainstServe(t, "Permits: 2")
	dlockBin := strings.TrimSuffix(prog, "example") + "dlock"
	ps := []*proc{start(t, "a", prog, env), start(t, "b", prog, env), start(t, "c", prog, env)}
	const importing = "importing with permit token "
	seenAt := map[*proc]time.Time{}
	for deadline := time.Now().Add(60 * time.Second); len(seenAt) < 2; time.Sleep(10 * time.Millisecond) {
		for _, p := range ps {
			if _, ok := p.seen(importing); ok && seenAt[p].IsZero() {
				seenAt[p] = time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than two copies got a permit within 60s: %d", len(seenAt))
		}
	}
	first := time.Now()
	for _, at := range seenAt {
		if at.Before(first) {
			first = at
		}
	}
	cmd := exec.CommandContext(t.Context(), dlockBin, "inspect", "imports")
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "held by 2 of 2 permits: token ") {
		t.Errorf("dlock inspect imports while two import: %v, %q; want 2 of 2 permits", err, out)
	}
	// The third gets its permit once one of the two gave theirs back, 2 s
	// after its grant at the earliest; a second is allowed for lines read
	// late.
	for deadline := time.Now().Add(60 * time.Second); len(seenAt) < 3; time.Sleep(10 * time.Millisecond) {
		for _, p := range ps {
			if _, ok := p.seen(importing); ok && seenAt[p].IsZero() {
				seenAt[p] = time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the third copy got no permit within 60s")
		}
	}
	for _, p := range ps {
		if after := seenAt[p].Sub(first); after > 0 && after < time.Second {
			// A copy seen later than the first, but too soon: unless it
			// was the first's partner, it got a third permit of 2.
			partners := 0
			for _, q := range ps {
				if !seenAt[q].After(seenAt[p]) {
					partners++
				}
			}
			if partners > 2 {
				t.Errorf("%s got a permit %v after the first of two, which hold theirs 2 s: three at once", p.name, after.Round(time.Millisecond))
			}
		}
	}
	tokens := map[string]bool{}
	for _, p := range ps {
		if err := p.wait(60 * time.Second); err != nil {
			t.Fatalf("%s: %v; its output:\n%s", p.name, err, strings.Join(p.all(), ""))
		}
		for _, prefix := range []string{importing, "reading the config with token ", "writing the config with token "} {
			l, ok := p.seen(prefix)
			if !ok {
				t.Fatalf("%s: no line %q in %q", p.name, prefix, p.all())
			}
			tok := strings.TrimSpace(strings.TrimPrefix(l, prefix))
			if n, err := strconv.ParseUint(tok, 10, 64); err != nil || n == 0 {
				t.Errorf("%s: %q: not a token", p.name, l)
			}
			key := "imports/" + tok // tokens are per key: the config's reader and writer share one
			if prefix != importing {
				key = "config/" + tok
			}
			if tokens[key] {
				t.Errorf("%s: token %s granted twice on one key", p.name, tok)
			}
			tokens[key] = true
		}
	}
}
