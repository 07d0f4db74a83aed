package redlock_test

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/doccheck"
	"github.com/dlock-go/dlock/redlock"
)

// TestTokenStatementIsOne: Guarantees().Notes, the package doc and the
// README say the same thing, word for word, about when tokens can go
// backwards.
func TestTokenStatementIsOne(t *testing.T) {
	cs := make([]goredis.UniversalClient, 3)
	for i := range cs {
		// Nothing listens on ports 1-3: New's script loading fails
		// quietly, and Guarantees needs no server.
		c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + string(rune('1'+i)), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	d, err := redlock.NewDriver(t.Context(), cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	doccheck.SameStatement(t, d.Guarantees().Notes, "Each node issues", "between the two grants.")
}
