package urlparam_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/urlparam"
)

// A dial that Open's deadline cancels does not hide the error that says
// why the dials before it failed (seen in CI: etcd's retry at the deadline
// left "operation was canceled" as the last dial error, instead of
// "connection refused").
func TestDialRecorderKeepsCauseOverCancellation(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var r urlparam.DialRecorder
	_, refused := net.Dial("tcp", addr)
	if refused == nil {
		t.Fatal("a dial to a closed port succeeded")
	}
	r.Note(refused)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, canceled := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	r.Note(canceled)
	if last := r.Last(); last == nil || !strings.Contains(last.Error(), "connection refused") {
		t.Errorf("last dial error %v; want the refused dial, not %v", last, canceled)
	}
	var only urlparam.DialRecorder
	only.Note(canceled)
	if only.Last() == nil {
		t.Error("a cancelled dial, the only one, was not recorded")
	}
}

// A certificate that did not verify stays the last dial error: refused
// dials to another server (one down, while the CA is wrong) and cancelled
// ones do not hide it; a later certificate error replaces it.
func TestDialRecorderKeepsCertificateError(t *testing.T) {
	bad := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	var r urlparam.DialRecorder
	r.Note(errors.New("dial tcp [::1]:2281: connect: connection refused"))
	r.Note(bad)
	r.Note(errors.New("dial tcp [::1]:2281: connect: connection refused"))
	r.Note(context.Canceled)
	if last := r.Last(); last != bad {
		t.Errorf("last dial error %v; want the certificate's", last)
	}
	other := &tls.CertificateVerificationError{Err: x509.HostnameError{Host: "zk1"}}
	r.Note(other)
	if last := r.Last(); last != other {
		t.Errorf("last dial error %v; want the latest certificate error", last)
	}
}
