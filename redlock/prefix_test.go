package redlock_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// A prefix with '{' or '}' is refused before any I/O, as the redis backend
// refuses it (issue 21, finding 9): the lock key is prefix + "{" + key +
// "}", whose braces make the Cluster hash tag and let Keys tell the key
// back; a brace in the prefix moves the tag and makes two (prefix, key)
// pairs one lock key ("a}" + "{b" and "a" + "}{b"). Seen failing before
// the check: New accepted "a{b" and dialled the nodes.
func TestPrefixWithBracesRefused(t *testing.T) {
	var addrs [3]string
	var conns [3]*atomic.Int64
	for i := range addrs {
		var port int
		port, conns[i] = countingListener(t)
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", port)
	}
	for _, prefix := range []string{"a{b", "a}", "{", "}x:"} {
		nodes := make([]goredis.UniversalClient, 3)
		for i := range nodes {
			nodes[i] = goredis.NewClient(&goredis.Options{Addr: addrs[i], MaxRetries: -1})
			defer nodes[i].Close()
		}
		_, err := redlock.New(t.Context(), nodes, &redlock.Options{Prefix: prefix})
		if !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("New with Prefix %q: err = %v; want ErrInvalidConfig", prefix, err)
		}
		u := fmt.Sprintf("redlock://%s/?prefix=%s", strings.Join(addrs[:], ","), url.QueryEscape(prefix))
		if _, err := dlock.Open(t.Context(), u); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("Open(%s): err = %v; want ErrInvalidConfig", u, err)
		}
	}
	for i, c := range conns {
		if n := c.Load(); n != 0 {
			t.Errorf("%d connections made to node %d; want the prefix refused before any I/O", n, i)
		}
	}
}
