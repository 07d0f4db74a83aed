package examplerun

import (
	"flag"
	"testing"
)

// set sets go test's flag name to value for the rest of the test.
func set(t *testing.T, name, value string) {
	t.Helper()
	old := flagValue(name)
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}

func TestSelected(t *testing.T) {
	for _, c := range []struct {
		run, skip string
		want      bool
	}{
		{"", "", true},
		{"^Example", "", true},
		{"ExampleNew", "", true},
		{"Example_open$", "", false},
		{"^$", "", false},
		{"TestTokens", "", false},
		{"TestX/ExampleNew", "", false}, // a subtest of TestX
		{"Example/sub", "", true},
		{"", "^Example", false},
		{"ExampleNew", "New", false},
		{"[", "", true}, // a pattern go test would refuse: servers are started
		// go test splits at top-level '|' first, then at '/' in each
		// alternative (not inside brackets or parentheses).
		{"TestX/sub|ExampleNew", "", true},
		{"TestX/sub|TestY", "", false},
		{"(TestX/sub|ExampleNew)", "", true},
		{"[/]|ExampleNew", "", true},
		{"", "TestX/sub|Example", false},
		{"", "Example/sub", true}, // skips only subtests: the examples run
		{"", "TestX|ExampleNew|ExampleURL", false},
		{"", "ExampleNew", true},
	} {
		set(t, "test.run", c.run)
		set(t, "test.skip", c.skip)
		if got := Selected("ExampleNew", "ExampleURLOpener"); got != c.want {
			t.Errorf("-run %q -skip %q: Selected = %v, want %v", c.run, c.skip, got, c.want)
		}
	}
}
