package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
)

// The tests of dlock run that run the command are in tests/dlockcmd (the
// development module).

// TestBadKeyBeforeIO: a key the library refuses (backend.ValidateKey:
// empty, too long, not UTF-8) is a usage error (status 2) found before
// the backend is opened: the URL's server does not exist, and the error
// names the key, not the connection (issue 22: dlock run waited 5s for
// the server, then failed with status 125).
func TestBadKeyBeforeIO(t *testing.T) {
	for _, name := range []string{"run", "inspect"} {
		for _, key := range []string{"", strings.Repeat("k", dlock.MaxKeyLen+1), "bad\xffutf8"} {
			args := []string{name, "--url", "etcd://127.0.0.1:1", key}
			if name == "run" {
				args = append(args, "--", "true")
			}
			var o, e bytes.Buffer
			code := dispatch(t.Context(), &env{stdout: &o, stderr: &e, getenv: func(string) string { return "" }}, args)
			stderr := e.String()
			if code != exitUsage || o.Len() != 0 || !strings.Contains(stderr, "key "+strconv.Quote(key)+": invalid key") ||
				strings.Contains(stderr, "127.0.0.1") || !strings.HasSuffix(stderr, "Run 'dlock "+name+" -h' for usage.\n") {
				t.Errorf("dlock %s with key %q: status %d, stdout %q, stderr %q; want 2 and a usage error naming the key",
					name, key, code, o.String(), stderr)
			}
		}
	}
}
