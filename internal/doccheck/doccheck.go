// Package doccheck lets a backend's tests check that its Guarantees().Notes,
// its package documentation and the README say one thing, word for word.
// Only test files import it.
package doccheck

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

var (
	space   = regexp.MustCompile(`\s+`)
	comment = regexp.MustCompile(`(?m)^//\s?`)
)

// SameStatement takes the statement of notes that runs from the text from to
// the text to (both included) and fails t unless doc.go (comment markers and
// line breaks aside) and ../README.md (line breaks aside), read from the
// package directory, contain it word for word.
func SameStatement(t testing.TB, notes, from, to string) {
	t.Helper()
	i, j := strings.Index(notes, from), strings.Index(notes, to)
	if i < 0 || j < i {
		t.Fatalf("Guarantees().Notes has no statement from %q to %q: %s", from, to, notes)
	}
	statement := notes[i : j+len(to)]
	for _, f := range []struct{ path, text string }{{"doc.go", "doc.go"}, {"../README.md", "README.md"}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.HasSuffix(f.path, ".go") {
			text = comment.ReplaceAllString(text, "")
		}
		if !strings.Contains(space.ReplaceAllString(text, " "), statement) {
			t.Errorf("%s does not say, word for word, what Guarantees().Notes says:\n%s", f.text, statement)
		}
	}
}
