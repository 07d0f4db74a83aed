package urlparam_test

import (
	"context"
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
