// Command dlock runs a command under a distributed lock, compares lock
// backends on your own servers, serves a local etcd for development, and
// shows who holds a lock.
//
// Usage:
//
//	dlock <command> [flags] [arguments]
//
// The commands are:
//
//	run      run a command while holding a lock, or while leading (--elect)
//	compare  run one workload against each backend and print a table
//	serve    start a single-member etcd for local development
//	inspect  show who holds a lock (read-only)
//	help     show help for a command
//
// Backends are chosen by URL, as in dlock.Open: --url, or DLOCK_URL; or by
// purpose (--purpose correctness|efficiency), with DLOCK_CORRECTNESS_URL and
// DLOCK_EFFICIENCY_URL (the URLs of a dlock.Config).
//
// Exit status: 0 on success; 2 for a usage error; 1 when a command other
// than run fails. dlock run passes the command's exit status through (128+N
// if a signal N ended it) and uses its own codes only when the command did
// not run to its end: 75 the lock was not acquired (--try found it held, or
// --wait passed), 124 the lease was lost and the command was stopped, 125
// dlock itself failed (bad URL, backend unreachable), 126 the command could
// not be started, 127 the command was not found. dlock run --elect, which
// campaigns and restarts the command until it is stopped, exits 0 once a
// signal has stopped it (125, 126, 127 and 2 as run).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Exit statuses (see the package documentation).
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotAcquired = 75 // EX_TEMPFAIL
	exitLeaseLost   = 124
	exitDlockFailed = 125
	exitCannotRun   = 126
	exitNotFound    = 127
)

// command is one subcommand: run parses args (the arguments after its
// name) and returns the exit status.
type command struct {
	name, short string
	run         func(ctx context.Context, env *env, args []string) int
}

// env is what a command may use of the process, so that tests can run the
// commands in-process as well as through the binary.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

var commands []*command // filled in by each command's file (init)

func register(c *command) { commands = append(commands, c) }

func main() {
	// go-redis logs to standard error on its own (a pool that fails to
	// dial prints "redis: ... pool.go:770: ... failed to dial" several
	// times), ahead of dlock's error, which already says why. Its global
	// logger is a program's to set, never a library's: dlock sends its
	// lines to slog at the debug level, which nothing enables by default.
	goredis.SetLogger(redisLogger{})
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	os.Exit(dispatch(context.Background(), e, os.Args[1:]))
}

// redisLogger is go-redis's logger in dlock: its lines go to slog's
// default logger at the debug level.
type redisLogger struct{}

// Printf logs the line at the debug level, formatted only if that level is
// enabled.
func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l := slog.Default(); l.Enabled(ctx, slog.LevelDebug) {
		l.DebugContext(ctx, "go-redis: "+strings.TrimSuffix(fmt.Sprintf(format, v...), "\n"))
	}
}

func dispatch(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c := lookup(args[1]); c != nil {
				return c.run(ctx, e, []string{"-h"})
			}
			fmt.Fprintf(e.stderr, "dlock help %s: unknown command. Run 'dlock help'.\n", args[1])
			return exitUsage
		}
		usage(e.stdout)
		return exitOK
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(e.stderr, "dlock %s: unknown command\nRun 'dlock help' for usage.\n", name)
		return exitUsage
	}
	return c.run(ctx, e, args[1:])
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprint(w, `dlock runs commands under a distributed lock, compares lock backends,
serves a local etcd, and shows who holds a lock.

Usage:

	dlock <command> [flags] [arguments]

The commands are:

`)
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-8s %s\n", c.name, c.short)
	}
	fmt.Fprint(w, `
Use "dlock help <command>" or "dlock <command> -h" for more about a command.
`)
}

// newFlagSet returns the flag set of dlock NAME, whose usage is text
// followed by the flags' defaults. Parse it with parseFlags.
func newFlagSet(name, text string) *flag.FlagSet {
	fs := flag.NewFlagSet("dlock "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), text)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs (made by newFlagSet for dlock NAME). ok
// is false when the command ends there, with status: help asked for (-h,
// --help) printed the usage once, on standard output (exitOK); a bad flag
// is a usage error, reported once on standard error as every other one is
// (usageFail: exitUsage).
func parseFlags(e *env, name string, fs *flag.FlagSet, args []string) (status int, ok bool) {
	// The flag package prints the error and the usage itself on a failure
	// (and the usage alone for -h): silenced here, each case is printed
	// once below.
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return exitOK, true
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(e.stdout)
		fs.Usage()
		return exitOK, false
	}
	return usageFail(e, name, "%v", err), false
}

// printable is s with every rune that is not printable (control
// characters, terminal escape sequences' ESC among them) written as a Go
// escape (\x1b, \n), for a string that comes from a server, such as a
// backend's error, printed to a terminal.
func printable(s string) string {
	if !strings.ContainsFunc(s, notPrintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if notPrintable(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func notPrintable(r rune) bool { return r != ' ' && !strconv.IsPrint(r) }

// keyErr is the message for key, refused by err (the library's key check,
// backend.ValidateKey, made before the backend is opened): for example
// `key "": invalid key: empty`.
func keyErr(key string, err error) string {
	return fmt.Sprintf("key %q: %s", key, strings.TrimPrefix(err.Error(), "dlock: "))
}

// usageFail prints "dlock NAME: message" and where to find the usage on
// standard error, and returns exitUsage.
func usageFail(e *env, name, format string, a ...any) int {
	fmt.Fprintf(e.stderr, "dlock "+name+": "+format+"\nRun 'dlock "+name+" -h' for usage.\n", a...)
	return exitUsage
}
