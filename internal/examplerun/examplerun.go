// Package examplerun lets a backend's examples (example_test.go, its
// documentation in go doc) run against real servers although the test
// servers live in the development module (tests/servers), which the
// library's packages do not import.
//
// An example shows the code a user writes: redis.New on a client of the
// server at an address. The address comes from a package-level variable
// that TestMain sets from an environment variable before the examples run,
// since an Example function has no testing.T to start servers with:
//
//	func TestMain(m *testing.M) {
//		if examplerun.Selected(exampleNames...) {
//			if addr, ok := examplerun.FromEnv("DLOCK_EXAMPLE_REDIS"); ok {
//				redisAddr = addr
//			}
//		}
//		os.Exit(m.Run())
//	}
//
// The development module's tests/examples starts the servers and runs each
// backend's examples (go test -run ^Example) with those variables set; a
// plain go test of the package skips its examples (FromEnv).
package examplerun

import (
	"flag"
	"fmt"
	"os"
	"regexp"
)

// Selected reports whether go test's -test.run and -test.skip flags select
// any of the named examples (or tests) at the top level, as go test reads
// them: a pattern is split into alternatives at '|' and each alternative
// into elements at '/' (neither inside brackets or parentheses); a name is
// run if the first element of some alternative matches it, and skipped if
// the first alternative whose first element matches it has no other
// element (an alternative with more skips only subtests). It parses the
// command line first if nobody has (a TestMain must do so to read flags).
// A pattern it cannot compile counts as selecting them.
func Selected(names ...string) bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	run := split(flagValue("test.run"))
	skip := split(flagValue("test.skip"))
	for _, n := range names {
		if ran, _ := match(run, n); run != nil && !ran {
			continue
		}
		if skipped, full := match(skip, n); skipped && full {
			continue
		}
		return true
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

// alternative is one alternative of a -run or -skip pattern: its first
// element, compiled, and whether more elements follow.
type alternative struct {
	first *regexp.Regexp
	more  bool
}

// split splits a -run or -skip pattern as go test does (testing's
// splitRegexp) into its alternatives. It returns nil for an empty pattern
// or one it cannot compile.
func split(pattern string) []alternative {
	if pattern == "" {
		return nil
	}
	var (
		alts   []alternative
		elems  []string
		cs, cp int
	)
	s := pattern
	for i := 0; i < len(s); {
		switch s[i] {
		case '[':
			cs++
		case ']':
			if cs--; cs < 0 {
				cs = 0
			}
		case '(':
			if cs == 0 {
				cp++
			}
		case ')':
			if cs == 0 {
				cp--
			}
		case '\\':
			i++
		case '/', '|':
			if cs == 0 && cp == 0 {
				elems = append(elems, s[:i])
				sep := s[i]
				s, i = s[i+1:], 0
				if sep == '|' {
					alts = append(alts, alternative{more: len(elems) > 1})
					alts[len(alts)-1].first, elems = compile(elems[0]), nil
				}
				continue
			}
		}
		i++
	}
	elems = append(elems, s)
	alts = append(alts, alternative{first: compile(elems[0]), more: len(elems) > 1})
	for _, a := range alts {
		if a.first == nil {
			return nil
		}
	}
	return alts
}

// compile compiles a pattern element; nil if it cannot.
func compile(elem string) *regexp.Regexp {
	re, err := regexp.Compile(elem)
	if err != nil {
		return nil
	}
	return re
}

// match reports whether an alternative of alts matches the top-level
// name, and whether the first that does is a full match (it has no
// further elements).
func match(alts []alternative, name string) (matched, full bool) {
	for _, a := range alts {
		if a.first.MatchString(name) {
			return true, !a.more
		}
	}
	return false, false
}

// skipExamples adds every example to go test's -test.skip.
func skipExamples() {
	skip := "^Example"
	if old := flagValue("test.skip"); old != "" {
		skip = old + "|" + skip
	}
	if err := flag.Set("test.skip", skip); err != nil {
		fmt.Fprintln(os.Stderr, "cannot skip the examples:", err)
		os.Exit(1)
	}
}

// FromEnv returns the value of the environment variable name: the address
// of a server for the examples, set by the development module's
// tests/examples, which starts the servers and runs the examples with it.
// If name is unset (a plain go test of the package), it prints why and
// skips every example (-test.skip), without failing even with
// DLOCK_REQUIRE_SERVERS=1: the examples run in tests/examples.
func FromEnv(name string) (string, bool) {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v, true
	}
	fmt.Fprintf(os.Stderr, "%s is not set: skipping the examples (tests/examples runs them against servers)\n", name)
	skipExamples()
	return "", false
}
