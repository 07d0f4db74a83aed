package redis_test

import (
	"errors"
	"log/slog"
	"net/url"
	"path/filepath"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
	"github.com/dlock-go/dlock/redis"
)

// The TLS parameters are refused before any I/O when they cannot be used:
// on redis:// (no TLS), or naming a file that is missing or holds no PEM,
// or a cert without its key.
func TestRedissBadTLSParams(t *testing.T) {
	dir := t.TempDir()
	notPEM := urltest.WriteFile(t, dir, "not.pem", []byte("not a certificate"))
	for _, u := range []string{
		"redis://127.0.0.1:1?ca=" + url.QueryEscape(notPEM),
		"redis://127.0.0.1:1?server_name=x",
		"rediss://127.0.0.1:1?ca=" + url.QueryEscape(filepath.Join(dir, "missing.pem")),
		"rediss://127.0.0.1:1?ca=" + url.QueryEscape(notPEM),
		"rediss://127.0.0.1:1?cert=" + url.QueryEscape(notPEM),
		"rediss://127.0.0.1:1?key=" + url.QueryEscape(notPEM),
		"rediss://127.0.0.1:1?cert=" + url.QueryEscape(notPEM) + "&key=" + url.QueryEscape(notPEM),
		"rediss://127.0.0.1:1?ca=",
	} {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := redis.ParseURL(pu); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("ParseURL(%s) = %v; want ErrInvalidConfig", u, err)
		}
	}
}

// A password sent in clear text to a server not on loopback is warned
// about; on loopback, or over TLS, it is not.
func TestPlaintextPasswordWarning(t *testing.T) {
	for _, c := range []struct {
		co   goredis.Options
		warn bool
	}{
		{goredis.Options{Addr: "10.1.2.3:6379", Password: "pw"}, true},
		{goredis.Options{Addr: "redis.example:6379", Username: "app", Password: "pw"}, true},
		{goredis.Options{Addr: "127.0.0.1:6379", Password: "pw"}, false},
		{goredis.Options{Addr: "localhost:6379", Password: "pw"}, false},
		{goredis.Options{Addr: "10.1.2.3:6379"}, false},
	} {
		rec := &urltest.Warnings{}
		redis.WarnTransport(slog.New(rec), &c.co)
		if got := len(rec.Containing("sent in clear text")); got != map[bool]int{true: 1, false: 0}[c.warn] {
			t.Errorf("%s (password %t): %d clear-text warnings; want warned %t", c.co.Addr, c.co.Password != "", got, c.warn)
		}
	}
	// Through parseURL: a redis:// URL with a password.
	u, _ := url.Parse("redis://:secret@10.1.2.3:6379/0")
	co, _, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	rec := &urltest.Warnings{}
	redis.WarnTransport(slog.New(rec), co)
	if len(rec.Containing("sent in clear text")) != 1 {
		t.Errorf("no clear-text warning for %s", u.Redacted())
	}
}
