package main

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
)

// The tests of dlock compare against real servers are in tests/dlockcmd
// (the development module).

func TestCompareUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"no URL", nil, nil, exitUsage, "dlock compare: no backend: give URLs, --url URL, set $DLOCK_URL, or use --purpose"},
		{"zero duration", []string{"--duration", "0s", "mem://"}, nil, exitUsage, "--duration must be positive"},
		{"empty prefix", []string{"--prefix", "/", "mem://"}, nil, exitUsage, "--prefix must not be empty"},
		{"not a URL", []string{"redis://%zz"}, nil, exitUsage, "bad URL"},
		{"unknown scheme", []string{"foo://x"}, nil, exitUsage, "cannot put the keys of a foo:// backend under --prefix"},
		{"bad flag", []string{"--no-such-flag", "mem://"}, nil, exitUsage, "flag provided but not defined"},
		{"bad purpose", []string{"--purpose", "speed"}, nil, exitUsage, `--purpose "speed": want`},
		{"purpose unset", []string{"--purpose", "correctness"}, nil, exitUsage, "--purpose correctness: $DLOCK_CORRECTNESS_URL is not set"},
		{"help", []string{"-h"}, nil, exitOK, "usage: dlock compare [flags] [URL...]"},
		{"unreachable", []string{"redis://127.0.0.1:1?dial_timeout=1s"}, nil, exitFailure,
			"dlock compare: opening redis://127.0.0.1:1?dial_timeout=1s&prefix=dlock-compare%3A: "},
		{"unreachable --url", []string{"--url", "redis://127.0.0.1:1?dial_timeout=1s"}, nil, exitFailure, "dlock compare: opening redis://127.0.0.1:1"},
		{"unreachable $DLOCK_URL", nil, map[string]string{"DLOCK_URL": "redis://127.0.0.1:1?dial_timeout=1s"}, exitFailure, "dlock compare: opening redis://127.0.0.1:1"},
		{"purpose refused", []string{"--purpose", "correctness"}, map[string]string{"DLOCK_CORRECTNESS_URL": "redis://127.0.0.1:1"}, exitFailure, "cannot serve purpose"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o, e bytes.Buffer
			code := dispatch(t.Context(), &env{stdout: &o, stderr: &e, getenv: func(k string) string { return tc.env[k] }}, append([]string{"compare"}, tc.args...))
			got, other := e.String(), o.String()
			if tc.code == exitOK {
				got, other = other, got
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("status %d, want %d; output %q, want it to contain %q", code, tc.code, got, tc.want)
			}
			if other != "" {
				t.Errorf("output on the other stream: %q", other)
			}
		})
	}
}

func TestCompareUnderPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:pw@h:6379/2?ttl=5s&prefix=app:": "redis://:pw@h:6379/2?prefix=p%3A&ttl=5s",
		"redlock://a:1,b:2,c:3":                   "redlock://a:1,b:2,c:3?prefix=p%3A",
		"redlocks://a:1,b:2,c:3?ca=ca.pem":        "redlocks://a:1,b:2,c:3?ca=ca.pem&prefix=p%3A",
		"etcd://h:2379/locks?ttl=15s":             "etcd://h:2379/p?ttl=15s",
		"zk://h:2181":                             "zk://h:2181/p",
		"zks://h:2281/locks?ca=ca.pem":            "zks://h:2281/p?ca=ca.pem",
		"mem://x":                                 "mem://x",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cmpUnderPrefix(u, "p")
		if err != nil || got.String() != want {
			t.Errorf("%s: %v, %v; want %s", in, got, err, want)
		}
	}
}
