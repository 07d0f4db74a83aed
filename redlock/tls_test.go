package redlock_test

import (
	"log/slog"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/urlparam/urltest"
	"github.com/dlock-go/dlock/redlock"
)

// The TLS parameters are refused before any I/O when they cannot be used:
// on redlock:// (no TLS), or naming a file that is missing or holds no PEM,
// or a cert without its key.
func TestRedlocksBadTLSParams(t *testing.T) {
	dir := t.TempDir()
	notPEM := url.QueryEscape(urltest.WriteFile(t, dir, "not.pem", []byte("not a certificate")))
	missing := url.QueryEscape(filepath.Join(dir, "missing.pem"))
	const nodes = "ADDR,127.0.0.1:2,127.0.0.1:3"
	urltest.Rejected(t, []urltest.Case{
		{URL: "redlock://" + nodes + "?ca=" + notPEM, Want: dlock.ErrInvalidConfig, Text: "needs the redlocks scheme"},
		{URL: "redlock://" + nodes + "?skip_verify=true", Want: dlock.ErrInvalidConfig, Text: "needs the redlocks scheme"},
		{URL: "redlocks://" + nodes + "?ca=" + missing, Want: dlock.ErrInvalidConfig, Text: "parameter ca"},
		{URL: "redlocks://" + nodes + "?ca=" + notPEM, Want: dlock.ErrInvalidConfig, Text: "no PEM certificate"},
		{URL: "redlocks://" + nodes + "?cert=" + notPEM, Want: dlock.ErrInvalidConfig, Text: "cert and key go together"},
		{URL: "redlocks://" + nodes + "?cert=" + notPEM + "&key=" + notPEM, Want: dlock.ErrInvalidConfig, Text: "client certificate"},
		{URL: "redlocks://" + nodes + "?skip_verify=maybe", Want: dlock.ErrInvalidConfig, Text: "skip_verify"},
		{URL: "redlocks://" + nodes + "?pool_size=4", Want: dlock.ErrInvalidConfig, Text: "known: ca, cert, dial_timeout"},
	})
}

// A password sent in clear text to nodes not on loopback is warned about,
// once; on loopback, or over TLS, it is not.
func TestPlaintextPasswordWarning(t *testing.T) {
	for raw, want := range map[string]int{
		"redlock://:pw@10.1.2.3:6379,10.1.2.4:6379,127.0.0.1:6379":   1,
		"redlock://:pw@127.0.0.1:6379,localhost:6380,127.0.0.2:6379": 0,
		"redlock://10.1.2.3:6379,10.1.2.4:6379,10.1.2.5:6379":        0,
		"redlocks://:pw@10.1.2.3:6379,10.1.2.4:6379,10.1.2.5:6379":   0,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		nodes, _, err := redlock.ParseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		rec := &urltest.Warnings{}
		redlock.WarnTransport(slog.New(rec), nodes)
		if got := len(rec.Containing("sent in clear text")); got != want {
			t.Errorf("%s: %d clear-text warnings; want %d", u.Redacted(), got, want)
		}
	}
}
