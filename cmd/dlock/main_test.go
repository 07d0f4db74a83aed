package main

import (
	"bytes"
	"strings"
	"testing"
)

// The tests of the command that need real servers are in tests/dlockcmd
// (the development module), which runs the built binary against them.

// TestHelpOnce: help asked for (-h, --help, dlock help NAME) is printed
// once, on standard output, with status 0; a bad flag is a usage error,
// reported once on standard error with status 2, like every other usage
// error (issue 22: run, inspect and serve printed -h's usage twice, on
// both streams).
func TestHelpOnce(t *testing.T) {
	run := func(args ...string) (stdout, stderr string, code int) {
		var o, e bytes.Buffer
		code = dispatch(t.Context(), &env{stdout: &o, stderr: &e, getenv: func(string) string { return "" }}, args)
		return o.String(), e.String(), code
	}
	for _, c := range commands {
		usage := "usage: dlock " + c.name + " "
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}} {
			stdout, stderr, code := run(args...)
			if code != exitOK || stderr != "" || strings.Count(stdout, usage) != 1 || !strings.HasPrefix(stdout, usage) {
				t.Errorf("dlock %s: status %d, stdout %q, stderr %q; want 0, the usage once on stdout, nothing on stderr",
					strings.Join(args, " "), code, stdout, stderr)
			}
		}
		stdout, stderr, code := run(c.name, "--no-such-flag")
		want := "dlock " + c.name + ": flag provided but not defined: -no-such-flag\nRun 'dlock " + c.name + " -h' for usage.\n"
		if code != exitUsage || stdout != "" || stderr != want {
			t.Errorf("dlock %s --no-such-flag: status %d, stdout %q, stderr %q; want 2, nothing on stdout, %q on stderr",
				c.name, code, stdout, stderr, want)
		}
	}
	if len(commands) != 5 {
		t.Errorf("%d commands checked, want 5 (run, compare, serve, inspect, demo)", len(commands))
	}
	const top = "dlock <command> [flags] [arguments]"
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		stdout, stderr, code := run(args...)
		if code != exitOK || stderr != "" || strings.Count(stdout, top) != 1 {
			t.Errorf("dlock %s: status %d, stdout %q, stderr %q; want 0, the usage once on stdout", args[0], code, stdout, stderr)
		}
	}
	stdout, stderr, code := run()
	if code != exitUsage || stdout != "" || strings.Count(stderr, top) != 1 {
		t.Errorf("dlock: status %d, stdout %q, stderr %q; want 2, the usage once on stderr", code, stdout, stderr)
	}
}
