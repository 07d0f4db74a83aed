package servers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// envServerd names a serverd binary to use instead of building one.
const envServerd = "DLOCK_SERVERD"

// request is one line to serverd; see the serverd command's documentation
// (tests/serverd) for the protocol. The two sides keep their own
// copies of these few types.
type request struct {
	ID       uint64   `json:"id"`
	Op       string   `json:"op"`
	Kind     string   `json:"kind,omitempty"`
	N        int      `json:"n,omitempty"`
	Args     []string `json:"args,omitempty"`
	Server   string   `json:"server,omitempty"`
	Group    string   `json:"group,omitempty"`
	Nanos    int64    `json:"nanos,omitempty"`
	Deadline int64    `json:"deadline,omitempty"`
	Target   uint64   `json:"target,omitempty"`
}

// response is one line from serverd.
type response struct {
	ID      uint64       `json:"id"`
	Servers []serverInfo `json:"servers,omitempty"`
	Group   string       `json:"group,omitempty"`
	CAPEM   []byte       `json:"ca_pem,omitempty"`
	Addr    string       `json:"addr,omitempty"`
	Error   *wireError   `json:"error,omitempty"`
}

type serverInfo struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Addr string `json:"addr"`
}

type wireError struct {
	Msg  string `json:"msg"`
	Code string `json:"code,omitempty"`
}

// remoteError is an error that serverd reported. Its code makes it match
// [ErrNoFaketime] or [ErrNeedsHostNetwork] (errors.Is), or marks something
// missing (Docker, an image), on which tests skip unless
// DLOCK_REQUIRE_SERVERS=1.
type remoteError struct {
	msg, code string
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Is(target error) bool {
	switch e.code {
	case "nofaketime":
		return target == ErrNoFaketime
	case "needshost":
		return target == ErrNeedsHostNetwork
	}
	return false
}

// isMissing reports whether err says that something the servers need is
// missing.
func isMissing(err error) bool {
	var re *remoteError
	return errors.As(err, &re) && re.code == "missing"
}

// daemon is this process's serverd child.
type daemon struct {
	cmd   *exec.Cmd
	wait  func() error // cmd.Wait; nil when there is no process (tests)
	stdin io.WriteCloser
	done  chan struct{} // closed when serverd's output has ended and it has exited
	err   error         // why it ended, with its exit status; set before done is closed
	exit  error         // wait's result; set before done is closed

	inMu sync.Mutex // serialises writes to stdin
	enc  *json.Encoder

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan response // buffered (1); the response is sent under mu
	// abandoned holds the "new" requests whose caller's context ended
	// before their response came: servers in a late response are
	// terminated at once.
	abandoned map[uint64]bool
}

var (
	daemonMu  sync.Mutex
	theDaemon *daemon
	daemonErr error // the first failure to start serverd; not retried
)

// getDaemon returns this process's serverd, starting it on first use.
func getDaemon() (*daemon, error) {
	daemonMu.Lock()
	defer daemonMu.Unlock()
	if theDaemon != nil || daemonErr != nil {
		return theDaemon, daemonErr
	}
	d, err := startDaemon()
	if err != nil {
		daemonErr = fmt.Errorf("servers: start serverd: %w", err)
		return nil, daemonErr
	}
	theDaemon = d
	return d, nil
}

// serverdBinary returns the serverd binary to run: $DLOCK_SERVERD, else one
// built now from its source in the development module (tests/serverd in
// this checkout), in a temporary directory that the caller removes (dir).
func serverdBinary() (bin, dir string, err error) {
	if p := os.Getenv(envServerd); p != "" {
		return p, "", nil
	}
	_, file, _, ok := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "serverd")
	if !ok || !filepath.IsAbs(file) {
		return "", "", fmt.Errorf("cannot locate the serverd source (built with -trimpath?); set %s to a serverd binary", envServerd)
	}
	if _, err := os.Stat(filepath.Join(src, "main.go")); err != nil {
		return "", "", fmt.Errorf("no serverd source at %s (%v); set %s to a serverd binary", src, err, envServerd)
	}
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gocmd); err != nil {
		gocmd = "go"
	}
	dir, err = os.MkdirTemp("", "dlock-serverd-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "serverd")
	build := exec.Command(gocmd, "build", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build in %s: %v\n%s", src, err, out)
	}
	return bin, dir, nil
}

func startDaemon() (*daemon, error) {
	bin, dir, err := serverdBinary()
	if err != nil {
		return nil, err
	}
	if dir != "" {
		// Linux runs a binary whose file is gone: nothing is left behind.
		defer os.RemoveAll(dir)
	}
	cmd := exec.Command(bin)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{
		cmd:     cmd,
		wait:    cmd.Wait,
		stdin:   stdin,
		enc:     json.NewEncoder(stdin),
		done:    make(chan struct{}),
		pending: map[uint64]chan response{},
	}
	go d.read(stdout)
	return d, nil
}

// read dispatches serverd's responses until its output ends.
func (d *daemon) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		var resp response
		if err := json.Unmarshal(sc.Bytes(), &resp); err != nil {
			fmt.Fprintf(os.Stderr, "servers: bad line from serverd %q: %v\n", sc.Bytes(), err)
			continue
		}
		d.mu.Lock()
		ch := d.pending[resp.ID]
		delete(d.pending, resp.ID)
		if ch != nil {
			ch <- resp // buffered; under mu, so that abandon sees it
		}
		abandoned := d.abandoned[resp.ID]
		delete(d.abandoned, resp.ID)
		d.mu.Unlock()
		if abandoned {
			d.reap(resp)
		}
	}
	// Its output ends when serverd exits (or dies): say how.
	status := "exited"
	if d.wait != nil {
		d.exit = d.wait()
		if d.exit != nil {
			status = "ended (" + d.exit.Error() + ")" // "exit status 2", "signal: killed"
		}
	}
	if err := sc.Err(); err != nil {
		d.err = fmt.Errorf("servers: reading serverd's output: %w; serverd has %s", err, status)
	} else {
		d.err = fmt.Errorf("servers: serverd has %s; its messages, if any, are on standard error", status)
	}
	close(d.done)
}

// abandon marks the request id, whose caller no longer waits for it, so
// that servers started for it are terminated: now if its response is in ch
// already, else when it comes.
func (d *daemon) abandon(id uint64, ch chan response) {
	d.mu.Lock()
	_, waiting := d.pending[id]
	delete(d.pending, id)
	if waiting {
		if d.abandoned == nil {
			d.abandoned = map[uint64]bool{}
		}
		d.abandoned[id] = true
	}
	d.mu.Unlock()
	if !waiting {
		select {
		case resp := <-ch:
			d.reap(resp)
		default:
		}
	}
}

// reap terminates the servers of a response nobody waits for. It does not
// wait for the terminations: their responses are dropped.
func (d *daemon) reap(resp response) {
	if resp.Error != nil {
		return
	}
	var reqs []request
	if resp.Group != "" {
		reqs = append(reqs, request{Op: "terminategroup", Group: resp.Group})
	} else {
		for _, si := range resp.Servers {
			reqs = append(reqs, request{Op: "terminate", Server: si.ID})
		}
	}
	for _, req := range reqs {
		d.mu.Lock()
		d.nextID++
		req.ID = d.nextID
		d.mu.Unlock()
		_ = d.send(req)
	}
}

// call sends req to serverd and waits for its response, or for ctx to end
// (the request is then cancelled in serverd). A response's error comes back
// as an error.
func call(ctx context.Context, req request) (response, error) {
	d, err := getDaemon()
	if err != nil {
		return response{}, err
	}
	return d.call(ctx, req)
}

func (d *daemon) call(ctx context.Context, req request) (response, error) {
	if dl, ok := ctx.Deadline(); ok {
		req.Deadline = dl.UnixNano()
	}
	ch := make(chan response, 1)
	d.mu.Lock()
	d.nextID++
	req.ID = d.nextID
	d.pending[req.ID] = ch
	d.mu.Unlock()
	forget := func() {
		d.mu.Lock()
		delete(d.pending, req.ID)
		d.mu.Unlock()
	}
	if err := d.send(req); err != nil {
		forget()
		// A write fails once serverd is gone: report that, and how it
		// ended, rather than a broken pipe.
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-d.done:
			return response{}, d.err
		case <-ctx.Done():
		case <-t.C:
		}
		return response{}, err
	}
	select {
	case resp := <-ch:
		if resp.Error != nil {
			return resp, &remoteError{msg: resp.Error.Msg, code: resp.Error.Code}
		}
		return resp, nil
	case <-ctx.Done():
		_ = d.send(request{Op: "cancel", Target: req.ID})
		if req.Op == "new" {
			d.abandon(req.ID, ch)
		} else {
			forget()
		}
		return response{}, fmt.Errorf("servers: %s: %w", req.Op, ctx.Err())
	case <-d.done:
		forget()
		return response{}, d.err
	}
}

func (d *daemon) send(req request) error {
	d.inMu.Lock()
	defer d.inMu.Unlock()
	if err := d.enc.Encode(req); err != nil {
		return fmt.Errorf("servers: send to serverd: %w", err)
	}
	return nil
}

// stop asks serverd to terminate everything it started, closes its input
// and waits for it to exit.
func (d *daemon) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := d.call(ctx, request{Op: "terminateall"})
	d.inMu.Lock()
	_ = d.stdin.Close()
	d.inMu.Unlock()
	select {
	case <-d.done:
	case <-ctx.Done():
		_ = d.cmd.Process.Kill()
		err = errors.Join(err, errors.New("servers: serverd did not exit in time; killed"))
		<-d.done
	}
	if d.exit != nil && err == nil {
		err = fmt.Errorf("servers: serverd: %w", d.exit)
	}
	return err
}
