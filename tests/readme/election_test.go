package readme

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestElectionExampleRuns runs the README's leader-election program as its
// text says: two copies against `dlock serve`; one leads and writes its
// reports; killed with SIGKILL, the other takes over with a higher term and
// writes; ^C (SIGINT) ends it cleanly.
func TestElectionExampleRuns(t *testing.T) {
	prog, serve, env := exampleAgainstServe(t, "dlock.NewElection(")
	a := start(t, "a", prog, env)
	b := start(t, "b", prog, env)
	leader, follower := a, b
	var term int
	deadline := time.Now().Add(60 * time.Second)
	for term == 0 {
		for _, p := range []*proc{a, b} {
			if l, ok := p.seen("leading with term "); ok {
				leader, follower = p, other(p, a, b)
				term = termOf(t, l)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no copy led within 60s\na: %q\nb: %q", a.all(), b.all())
		}
		time.Sleep(50 * time.Millisecond)
	}
	leader.waitLine(t, fmt.Sprintf(", term %d\n", term), 30*time.Second) // "wrote report of …, term N"
	if l, ok := follower.seen("leading with term "); ok {
		t.Fatalf("both copies lead: %q and the leader's term %d", l, term)
	}

	killed := time.Now()
	if err := leader.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	l := follower.waitLine(t, "leading with term ", 60*time.Second)
	next := termOf(t, l)
	t.Logf("term %d killed; term %d led %v later", term, next, time.Since(killed).Round(time.Millisecond))
	if next <= term {
		t.Errorf("the new leader's term %d is not above the killed leader's %d", next, term)
	}
	follower.waitLine(t, fmt.Sprintf(", term %d\n", next), 30*time.Second)

	if err := follower.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	follower.waitLine(t, fmt.Sprintf("term %d over: ", next), 30*time.Second)
	if err := follower.wait(30 * time.Second); err != nil {
		t.Errorf("the leader after ^C: %v, want exit status 0\n%s", err, follower.all())
	}
	if err := serve.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := serve.wait(60 * time.Second); err != nil {
		t.Errorf("dlock serve after ^C: %v", err)
	}
}

// exampleAgainstServe builds the README's Go block that contains marker
// and the dlock command, and starts `dlock serve` on a free loopback port
// with its data in the test's directory. It returns the program, the
// serve process and the environment that points a program at it
// (DLOCK_URL).
func exampleAgainstServe(t *testing.T, marker string) (prog string, serve *proc, env []string) {
	t.Helper()
	md, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := goBlocks(md)
	if err != nil {
		t.Fatal(err)
	}
	var code string
	for _, b := range blocks {
		if strings.Contains(b.code, marker) {
			code = b.code
		}
	}
	if code == "" {
		t.Fatalf("the README has no Go block with %q", marker)
	}
	module, err := filepath.Abs("..") // the tests module: go.work in force
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	prog, dlockBin := filepath.Join(dir, "example"), filepath.Join(dir, "dlock")
	for _, args := range [][]string{
		{"build", "-o", prog, filepath.Join(dir, "main.go")},
		{"build", "-o", dlockBin, "github.com/dlock-go/dlock/cmd/dlock"},
	} {
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = module
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// dlock serve, on a free loopback port, with its data in the test's
	// directory.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	serve = start(t, "serve", dlockBin, nil, "serve", "--data", filepath.Join(dir, "data"), "--listen", addr)
	url := serve.waitLine(t, "etcd://", 90*time.Second)
	return prog, serve, []string{"DLOCK_URL=" + url}
}

func other(p, a, b *proc) *proc {
	if p == a {
		return b
	}
	return a
}

func termOf(t *testing.T, line string) int {
	t.Helper()
	f := strings.Fields(line)
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil || n <= 0 {
		t.Fatalf("no term in %q", line)
	}
	return n
}

// proc is a child process whose standard output is read line by line.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  chan []string // the lines so far, passed around as a token
	done chan error
}

func start(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, out: make(chan []string, 1), done: make(chan error, 1)}
	p.out <- nil
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text() + "\n"
			all := <-p.out
			p.out <- append(all, l)
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
		}
	})
	return p
}

// all returns the lines read so far.
func (p *proc) all() []string {
	all := <-p.out
	p.out <- all
	return append([]string(nil), all...)
}

// seen returns the first line read so far that contains s.
func (p *proc) seen(s string) (string, bool) {
	for _, l := range p.all() {
		if strings.Contains(l, s) {
			return l, true
		}
	}
	return "", false
}

// waitLine waits up to d for a line that contains s.
func (p *proc) waitLine(t *testing.T, s string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if l, ok := p.seen(s); ok {
			return strings.TrimSuffix(l, "\n")
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no line with %q within %v; its output:\n%s", p.name, s, d, strings.Join(p.all(), ""))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wait waits up to d for the process to exit.
func (p *proc) wait(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s did not exit within %v", p.name, d)
	}
}
