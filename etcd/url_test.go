package etcd_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url       string
		endpoints []string
		prefix    string
		user      string
	}{
		{"etcd://h1:2379,h2:2380/locks?dial_timeout=2s&request_timeout=3s", []string{"http://h1:2379", "http://h2:2380"}, "locks/", ""},
		{"etcd://u:p@h1", []string{"http://h1:2379"}, "", "u"},
		{"etcds://h1:2379/a/b/", []string{"https://h1:2379"}, "a/b/", ""},
	} {
		u, _ := url.Parse(tc.url)
		cfg, o, err := etcd.ParseURL(u)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if len(cfg.Endpoints) != len(tc.endpoints) || cfg.Endpoints[0] != tc.endpoints[0] || cfg.Endpoints[len(cfg.Endpoints)-1] != tc.endpoints[len(tc.endpoints)-1] {
			t.Errorf("%s: endpoints %v, want %v", tc.url, cfg.Endpoints, tc.endpoints)
		}
		if o.Prefix != tc.prefix || cfg.Username != tc.user {
			t.Errorf("%s: prefix %q user %q, want %q %q", tc.url, o.Prefix, cfg.Username, tc.prefix, tc.user)
		}
		// gRPC keepalive pings: a watch on a member that froze moves to
		// another member instead of staying silent.
		if cfg.DialKeepAliveTime <= 0 || cfg.DialKeepAliveTimeout <= 0 {
			t.Errorf("%s: DialKeepAliveTime %v, DialKeepAliveTimeout %v; want both set", tc.url, cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout)
		}
	}
	if u, _ := url.Parse("etcd://h1?request_timeout=3s"); true {
		if _, o, err := etcd.ParseURL(u); err != nil || o.RequestTimeout != 3*time.Second {
			t.Errorf("request_timeout=3s: %+v, %v; want RequestTimeout 3s", o, err)
		}
	}
	for _, bad := range []string{
		"etcd:///locks",                     // no endpoints
		"etcd://h1,,h2",                     // empty host
		"etcd://h1?foo=1",                   // unknown parameter
		"etcd://h1?dial_timeout=soon",       // bad duration
		"etcd://h1?request_timeout=0s",      // not positive
		"etcd://h1?request_timeout=-1s",     // not positive
		"etcd://h1?ca=/x.pem",               // TLS parameter without TLS
		"etcds://h1?cert=/c.pem",            // cert without key
		"etcds://h1?ca=/does/not/exist.pem", // unreadable CA
		"etcd://h1?dial_timeout=1s&dial_timeout=2s",
	} {
		u, err := url.Parse(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := etcd.ParseURL(u); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}
