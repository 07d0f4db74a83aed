package redis_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
)

// badURLs are redis URLs Open must reject before any I/O (issue 13).
var badURLs = []urltest.Case{
	{URL: "redis://ADDR?pool_size=-5", Want: dlock.ErrInvalidConfig, Text: `pool_size="-5": want a whole number from 0 to 65536`},
	{URL: "redis://ADDR?pool_size=3000000000", Want: dlock.ErrInvalidConfig, Text: `pool_size="3000000000"`},
	{URL: "redis://ADDR?pipeline_read_buffer_size=2000000000", Want: dlock.ErrInvalidConfig, Text: "pipeline_read_buffer_size"},
	{URL: "redis://ADDR?max_retries=-2", Want: dlock.ErrInvalidConfig, Text: "max_retries"},
	{URL: "redis://ADDR?protocol=9", Want: dlock.ErrInvalidConfig, Text: `protocol="9"`},
	{URL: "redis://ADDR?read_timeout=soon", Want: dlock.ErrInvalidConfig, Text: "read_timeout"},
	{URL: "redis://ADDR?pool_fifo=maybe", Want: dlock.ErrInvalidConfig, Text: "pool_fifo"},
	{URL: "redis://ADDR?ttl=1s;prefix=x", Want: dlock.ErrInvalidConfig, Text: "invalid semicolon separator"},
	{URL: "redis://ADDR?prefix=%zz", Want: dlock.ErrInvalidConfig, Text: "invalid URL escape"},
	{URL: "redis://ADDR?prefix=a&prefix=b", Want: dlock.ErrInvalidConfig, Text: "parameter prefix"},
	{URL: "redis://127.0.0.1:99999", Want: dlock.ErrInvalidConfig, Text: `port "99999"`},
	{URL: "redis://127.0.0.1:0", Want: dlock.ErrInvalidConfig, Text: `port "0"`},
	{URL: "redis://", Want: dlock.ErrInvalidConfig, Text: "no server given"},
	{URL: "redis:///3", Want: dlock.ErrInvalidConfig, Text: "no server given"},
	{URL: "redis://:6379", Want: dlock.ErrInvalidConfig, Text: "empty host"},
	{URL: "redis://ADDR,ADDR", Want: dlock.ErrInvalidConfig, Text: "one server per URL"},
	{URL: "redis://ADDR/-1", Want: dlock.ErrInvalidConfig, Text: `database "-1"`},
	{URL: "redis://ADDR?dial_timeout=0s", Want: dlock.ErrInvalidConfig, Text: "dial_timeout"},
	{URL: "redis://ADDR?bogus=1", Want: dlock.ErrInvalidConfig, Text: `unknown parameter "bogus" (known: client_name, conn_max_idle_time,`},
	{URL: "redis://ADDR?skip_verify=true", Want: dlock.ErrInvalidConfig, Text: `unknown parameter "skip_verify"`},
	{URL: "rediss://ADDR?pool_size=-1", Want: dlock.ErrInvalidConfig, Text: "pool_size"},
	{URL: "redis://ADDR?ttl=0s", Want: dlock.ErrInvalidConfig, Text: "ttl"},
	// A TTL that WAIT could outlast (issue 22): refused at open, not at
	// the first acquire.
	{URL: "redis://ADDR?wait_replicas=1&wait_timeout=1s&ttl=500ms", Want: dlock.ErrInvalidConfig, Text: "TTL 500ms (ttl) is not longer than WaitTimeout 1s (wait_timeout)"},
	{URL: "redis://ADDR?wait_replicas=1&wait_timeout=1s&ttl=1s", Want: dlock.ErrInvalidConfig, Text: "TTL 1s (ttl) is not longer than WaitTimeout 1s (wait_timeout)"},
	{URL: "redis://ADDR?wait_replicas=1&wait_timeout=40s&read_timeout=60s", Want: dlock.ErrInvalidTTL, Text: "TTL 30s (ttl) is not longer than WaitTimeout 40s (wait_timeout)"},
}

func TestOpenBadURLs(t *testing.T) { urltest.Rejected(t, badURLs) }

func seeds(scheme string) []string {
	s := []string{scheme + "://ADDR", scheme + "://ADDR/2?ttl=5s&prefix=p:&pool_size=4&read_timeout=3&dial_timeout=1s"}
	for _, c := range badURLs { // in the fuzzer's scheme
		if rest, ok := strings.CutPrefix(c.URL, "redis://"); ok {
			s = append(s, scheme+"://"+rest)
		}
	}
	return s
}

func FuzzOpenURLRedis(f *testing.F)  { urltest.Fuzz(f, "redis", seeds("redis")) }
func FuzzOpenURLRediss(f *testing.F) { urltest.Fuzz(f, "rediss", seeds("rediss")) }

// TestOpenNoServer: with nothing listening, or a server that never
// answers, Open returns by its dial_timeout (plus a margin) and says why.
func TestOpenNoServer(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		urltest.Unreachable(t, "redis://ADDR?dial_timeout=1s", urltest.RefusedAddr(t), time.Second, "connection refused")
	})
	t.Run("silent", func(t *testing.T) {
		urltest.Unreachable(t, "redis://ADDR?dial_timeout=1s", urltest.Listen(t).Addr(), time.Second, "dial_timeout (1s)")
	})
}
