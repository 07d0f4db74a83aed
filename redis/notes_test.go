package redis_test

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/doccheck"
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
	doccheck.SameStatement(t, d.Guarantees().Notes, "Each token is the larger", "by a server with a faster clock).")
}
