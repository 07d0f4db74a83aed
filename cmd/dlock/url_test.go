package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// badURLs are URLs that do not parse, each with a password (or part of
// one) that must never be printed: a bad %-escape (url.Error quotes the
// whole URL) and a '/' in the password (url.Parse's own error quotes
// ":S3cr" as an invalid port).
var badURLs = []struct{ raw, secret, scheme string }{
	{"redis://app:p%zzSECRET@localhost:6379", "SECRET", "redis"},
	{"etcd://app:S3cr/et@localhost:2379", "S3cr", "etcd"},
	// These parse, but not as meant: the host is "app:2024" (or
	// "localhost:2024") and the password is in the path or the fragment.
	{"redis://localhost:2024/S3cret@127.0.0.1:6379", "S3cret", "redis"},
	{"etcd://localhost:2024#S3cret@127.0.0.1:2379", "S3cret", "etcd"},
}

// TestRedacted: a URL that parses loses its password; one that does not
// is shown by its scheme alone (issue 21, finding 3).
func TestRedacted(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"redis://app:secret@localhost:6379/0?ttl=5s", "redis://app:xxxxx@localhost:6379/0?ttl=5s"},
		{"etcd://localhost:2379", "etcd://localhost:2379"},
		{"redis://app:p%zzSECRET@localhost:6379", "redis://…"},
		{"zk://app:S3cr/et@localhost:2181", "zk://…"},
		{"REDIS://app:S3cr/et@h", "REDIS://…"},
		{"1redis://app:S3cr/et@localhost", "<a URL that does not parse>"},
		{"re dis://app:S3cr/et@localhost", "<a URL that does not parse>"},
		{"redis://app:S3cret\x1b[2J@h", "redis://…"},
		{"redis://app:2024/S3cret@h:6379", "redis://…"},
		{"zk://app:2024?S3cret@h:2181", "zk://…"},
		{"etcd://h:2379/locks?client=a@b", "etcd://…"},
		{"etcd://h:2379/locks?client=a%40b", "etcd://h:2379/locks?client=a%40b"},
	} {
		if got := redacted(tc.raw); got != tc.want {
			t.Errorf("redacted(%q) = %q, want %q", tc.raw, got, tc.want)
		}
	}
}

// TestBadURLNotPrinted: run, inspect and compare, given a URL that does
// not parse (by --url, as an argument, in $DLOCK_URL or for --purpose),
// name its scheme and never print its password.
func TestBadURLNotPrinted(t *testing.T) {
	for _, tc := range badURLs {
		for _, c := range []struct {
			args []string
			env  map[string]string
		}{
			{args: []string{"run", "--url", tc.raw, "k", "--", "true"}},
			{args: []string{"run", "k", "--", "true"}, env: map[string]string{envURL: tc.raw}},
			{args: []string{"run", "--purpose", "correctness", "k", "--", "true"}, env: map[string]string{envCorrectness: tc.raw}},
			{args: []string{"inspect", tc.raw, "k"}},
			{args: []string{"inspect", "--purpose", "efficiency", "k"}, env: map[string]string{envEfficiency: tc.raw}},
			{args: []string{"compare", tc.raw}},
			{args: []string{"compare"}, env: map[string]string{envURL: tc.raw}},
			{args: []string{"compare", "--purpose", "correctness"}, env: map[string]string{envCorrectness: tc.raw}},
		} {
			var stdout, stderr bytes.Buffer
			e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return c.env[k] }}
			code := dispatch(context.Background(), e, c.args)
			out := stdout.String() + stderr.String()
			if code == exitOK {
				t.Errorf("dlock %q (env %q): status 0, want a failure", c.args, c.env)
			}
			if strings.Contains(out, tc.secret) {
				t.Errorf("dlock %q (env %q) printed the password %q:\n%s", c.args, c.env, tc.secret, out)
			}
			if !strings.Contains(out, tc.scheme) {
				t.Errorf("dlock %q (env %q): the output does not name the scheme %q:\n%s", c.args, c.env, tc.scheme, out)
			}
		}
	}
}

// TestPrintable: a server's string printed in an error line reaches the
// terminal without control characters (issue 21, finding 9).
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		`etcd: "orders/42" held`:       `etcd: "orders/42" held`,
		"key \x1b[2J\x1b[H cleared":    `key \x1b[2J\x1b[H cleared`,
		"two\nlines\r\tand \x7f\u202e": `two\nlines\r\tand \x7f\u202e`,
		"ünïcode ok":                   "ünïcode ok",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}
