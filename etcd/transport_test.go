package etcd_test

import (
	"crypto/tls"
	"log/slog"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
)

// A password sent without TLS to an endpoint that is not on loopback is
// warned about once; on loopback, over TLS or without a password, nothing
// is logged. (No I/O: the warning comes from the client's configuration.)
func TestPlaintextPasswordWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  clientv3.Config
		warn bool
	}{
		{"remote with password", clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379", "http://etcd.internal:2379"}, Password: "pw"}, true},
		{"loopback with password", clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"}, Password: "pw"}, false},
		{"remote over TLS", clientv3.Config{Endpoints: []string{"https://etcd.internal:2379"}, Password: "pw", TLS: &tls.Config{}}, false},
		{"remote without password", clientv3.Config{Endpoints: []string{"http://etcd.internal:2379"}}, false},
	} {
		rec := &conformance.LogRecorder{}
		etcd.WarnTransport(slog.New(rec), &tc.cfg)
		got := rec.Above(slog.LevelInfo)
		if tc.warn && (len(got) != 1 || !rec.Contains("clear text")) {
			t.Errorf("%s: warnings %q; want one about the clear-text password", tc.name, got)
		}
		if !tc.warn && len(got) != 0 {
			t.Errorf("%s: warnings %q; want none", tc.name, got)
		}
	}
}
