// Package examplerun lets a test package's TestMain start the servers its
// examples need only when the run includes them, and give up on them the
// way conformance/servers gives up on a test's servers.
//
// A backend's examples (example_test.go) show the code a user writes:
// redis.New on a client of the server at an address. The address comes from
// a package-level variable that TestMain sets before the tests and examples
// run, since an Example function has no testing.T to start servers with:
//
//	func TestMain(m *testing.M) { startExampleServers(); servers.Main(m) }
//
//	func startExampleServers() {
//		if !examplerun.Selected(exampleNames...) {
//			return
//		}
//		srv, err := servers.StartRedis(ctx, 1)
//		if err != nil {
//			examplerun.GiveUp("a Redis server", err)
//			return
//		}
//		redisAddr = srv[0].Addr()
//	}
//
// servers.Main removes the servers at the end, as it does the tests'.
package examplerun

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// envRequire is conformance/servers' switch: servers are required.
const envRequire = "DLOCK_REQUIRE_SERVERS"

// Selected reports whether go test's -test.run and -test.skip flags select
// any of the named examples (or tests) at the top level. It parses the
// command line first if nobody has (a TestMain must do so to read flags).
// A flag it cannot read counts as selecting them.
func Selected(names ...string) bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	run := topLevel(flagValue("test.run"))
	skip := topLevel(flagValue("test.skip"))
	for _, n := range names {
		if (run == nil || run.MatchString(n)) && (skip == nil || !skip.MatchString(n)) {
			return true
		}
	}
	return false
}

// flagValue returns the value of the named flag, "" if there is none.
func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// topLevel compiles the first element of a -run or -skip pattern (the part
// that matches top-level names; go test splits patterns at slashes). It
// returns nil for an empty pattern or one it cannot compile.
func topLevel(pattern string) *regexp.Regexp {
	first, _, _ := strings.Cut(pattern, "/")
	if first == "" {
		return nil
	}
	re, err := regexp.Compile(first)
	if err != nil {
		return nil
	}
	return re
}

// GiveUp reports that the examples' servers (what) could not be started:
// with DLOCK_REQUIRE_SERVERS=1 it exits with status 1 (the servers started
// so far are removed by conformance/servers' child process when this
// process ends); else it prints why and skips every example (-test.skip).
func GiveUp(what string, err error) {
	msg := fmt.Sprintf("cannot start %s for the examples: %v", what, err)
	if os.Getenv(envRequire) == "1" {
		fmt.Fprintf(os.Stderr, "%s\n(%s=1: servers are required)\n", msg, envRequire)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "%s\n(skipping the examples; set %s=1 to fail instead)\n", msg, envRequire)
	skip := "^Example"
	if old := flagValue("test.skip"); old != "" {
		skip = old + "|" + skip
	}
	if err := flag.Set("test.skip", skip); err != nil {
		fmt.Fprintln(os.Stderr, "cannot skip the examples:", err)
		os.Exit(1)
	}
}
