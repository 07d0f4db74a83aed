package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

// TestExamples runs each backend's examples (its example_test.go: the
// package's documentation in go doc, kept in the backend's directory)
// against servers started here, since the library's packages do not start
// servers: go test -run ^Example PKG with the server's address in the
// environment variable the examples read (internal/examplerun.FromEnv).
// Every example must run and pass: one that was skipped (the variable not
// read) or whose output differs from its Output comment fails the test.
func TestExamples(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the source (built with -trimpath?)")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	for _, c := range []struct {
		pkg, env string
		examples []string
		addr     func(t *testing.T) string
	}{
		{"./redis", "DLOCK_EXAMPLE_REDIS", []string{"ExampleNew", "ExampleURLOpener", "Example_open"},
			func(t *testing.T) string { return strings.Join(redisAddrs(t, 1), ",") }},
		{"./redlock", "DLOCK_EXAMPLE_REDLOCK", []string{"ExampleNew", "ExampleURLOpener", "Example_open"},
			func(t *testing.T) string { return strings.Join(redisAddrs(t, 3), ",") }},
		{"./etcd", "DLOCK_EXAMPLE_ETCD", []string{"ExampleNew", "ExampleURLOpener", "Example_open", "ExampleOwnerOf"},
			func(t *testing.T) string {
				c, err := servers.StartEtcd(t.Context(), 1)
				if err != nil {
					t.Fatalf("StartEtcd: %v", err)
				}
				t.Cleanup(func() { _ = c.Terminate(context.WithoutCancel(t.Context())) })
				return strings.Join(c.Endpoints(), ",")
			}},
		{"./zookeeper", "DLOCK_EXAMPLE_ZOOKEEPER", []string{"ExampleNew", "ExampleURLOpener", "Example_open"},
			func(t *testing.T) string {
				e, err := servers.StartZooKeeper(t.Context(), 1)
				if err != nil {
					t.Fatalf("StartZooKeeper: %v", err)
				}
				t.Cleanup(func() { _ = e.Terminate(context.WithoutCancel(t.Context())) })
				return strings.Join(e.Servers(), ",")
			}},
	} {
		t.Run(strings.TrimPrefix(c.pkg, "./"), func(t *testing.T) {
			t.Parallel()
			servers.Redis(t, 1) // skips (or fails) as any server test when there are no servers
			addr := c.addr(t)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, goTool, "test", "-count=1", "-v", "-run", "^Example", c.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), c.env+"="+addr)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s=%s go test -run ^Example %s: %v\n%s", c.env, addr, c.pkg, err, out)
			}
			for _, name := range c.examples {
				if !strings.Contains(string(out), "--- PASS: "+name+" ") {
					t.Errorf("%s: %s did not run and pass:\n%s", c.pkg, name, out)
				}
			}
		})
	}
}

// redisAddrs starts n Redis servers for t alone and returns their
// addresses.
func redisAddrs(t *testing.T, n int) []string {
	ss, err := servers.StartRedis(t.Context(), n)
	if err != nil {
		t.Fatalf("StartRedis: %v", err)
	}
	addrs := make([]string, n)
	for i, s := range ss {
		t.Cleanup(func() { _ = s.Terminate(context.WithoutCancel(t.Context())) })
		addrs[i] = s.Addr()
	}
	return addrs
}
