package redis_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/redis"
)

// TestTokenStatementIsOne: Guarantees().Notes, the package doc and the
// README say the same thing, word for word, about when tokens can go
// backwards.
func TestTokenStatementIsOne(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never used
	defer c.Close()
	d, err := redis.NewDriverNoIO(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	notes := d.Guarantees().Notes
	const from, to = "Each token is the larger", "by a server with a faster clock)."
	i, j := strings.Index(notes, from), strings.Index(notes, to)
	if i < 0 || j < i {
		t.Fatalf("Guarantees().Notes has no token statement (from %q to %q): %s", from, to, notes)
	}
	statement := notes[i : j+len(to)]
	space := regexp.MustCompile(`\s+`)
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	docText := space.ReplaceAllString(regexp.MustCompile(`(?m)^//\s?`).ReplaceAllString(string(doc), ""), " ")
	if !strings.Contains(docText, statement) {
		t.Errorf("doc.go does not say, word for word, what Guarantees().Notes says:\n%s", statement)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(space.ReplaceAllString(string(readme), " "), statement) {
		t.Errorf("README.md does not say, word for word, what Guarantees().Notes says:\n%s", statement)
	}
}
