package servers_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

// envCrashChild makes the test binary, run again by TestCrashLeavesNothing,
// start a Redis server, print its address and die of SIGKILL.
const envCrashChild = "DLOCK_SERVERS_CRASH_CHILD"

func init() {
	if os.Getenv(envCrashChild) != "1" {
		return
	}
	ss, err := servers.StartRedis(context.Background(), 1)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("addr:", ss[0].Addr())
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// redisUp reports whether a Redis server answers PING at addr.
func redisUp(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// TestCrashLeavesNothing: a test process that dies (SIGKILL: no TestMain,
// no cleanup of its own) leaves no server running: its reaper sees its
// input end and removes the containers the process started.
func TestCrashLeavesNothing(t *testing.T) {
	servers.Redis(t, 1) // skips (or fails) as any server test when there are no servers
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v; want death by SIGKILL; output:\n%s", err, out)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "addr: ")
	if !ok {
		t.Fatalf("child's output: %q; want its server's address", out)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for redisUp(addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the server of a killed test process (%s) still answers 2 minutes later", addr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestConcurrentControls: fault controls of different servers proceed
// concurrently: while one server is paused and started again, another one
// stops and starts.
func TestConcurrentControls(t *testing.T) {
	servers.Redis(t, 1) // skips (or fails) as any server test when there are no servers
	ctx := t.Context()
	ss, err := servers.StartRedis(ctx, 2)
	if err != nil {
		t.Fatalf("StartRedis: %v", err)
	}
	for _, s := range ss {
		t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(ctx)) })
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() {
		if errs[0] = ss[0].Stop(ctx); errs[0] == nil {
			errs[0] = ss[0].Start(ctx)
		}
	})
	wg.Go(func() {
		if errs[1] = ss[1].Pause(ctx); errs[1] == nil {
			errs[1] = ss[1].Unpause(ctx)
		}
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		deadline := time.Now().Add(30 * time.Second)
		for !redisUp(s.Addr()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s does not answer PING 30s after its restart", s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestErrors: errors that tests tell apart: a start whose context has
// ended fails with its context's error, and ErrNeedsHostNetwork matches.
func TestErrors(t *testing.T) {
	servers.Redis(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := servers.StartRedis(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("StartRedis with a cancelled context: %v; want context.Canceled", err)
	}
	if os.Getenv("DLOCK_TEST_NETWORK") != "host" {
		if _, err := servers.StartRedisSentinel(t.Context()); !errors.Is(err, servers.ErrNeedsHostNetwork) {
			t.Errorf("StartRedisSentinel in bridge mode: %v; want ErrNeedsHostNetwork", err)
		}
	}
}

// TestCancelledStartLeavesNothing: a start whose context ends while its
// containers are being created and waited for returns an error and
// terminates what it had started: no container of this process is left
// (counted by the owner label, with the docker command). The context ends
// after a few delays in turn, so that some end mid-start; the shortest end
// during Docker's create, which must not leave a container the start
// never got hold of.
func TestCancelledStartLeavesNothing(t *testing.T) {
	servers.ZooKeeper(t, 1) // skips (or fails) as any server test when there are no servers
	mine := func() int {
		out, err := exec.CommandContext(t.Context(), "docker", "ps", "-aq", "--filter", "label=dlock.test.owner="+servers.Owner, "--filter", "label=dlock.test.kind=etcd").Output()
		if err != nil {
			t.Fatalf("docker ps: %v", err)
		}
		return len(strings.Fields(string(out)))
	}
	cancelled := 0
	for _, d := range []time.Duration{10 * time.Millisecond, 15 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond, time.Second, 2 * time.Second} {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		c, err := servers.StartEtcd(ctx, 3)
		cancel()
		if err == nil {
			_ = c.Terminate(t.Context())
			continue
		}
		cancelled++
		if n := mine(); n != 0 {
			t.Errorf("a start of a 3-member etcd cluster cut after %v (%v) left %d containers", d, err, n)
		}
	}
	if cancelled == 0 {
		t.Fatal("every start finished before its context ended: nothing was cut mid-start")
	}
}
