package dlockcmd_test

import (
	"testing"

	"github.com/dlock-go/dlock/tests/servers"

	// The schemes the tests open in process, beside the binary, to hold
	// and inspect locks (the command registers every backend in url.go).
	_ "github.com/dlock-go/dlock/etcd"  // etcd://
	_ "github.com/dlock-go/dlock/redis" // redis://
)

// TestMain removes the test servers (tests/servers) once the tests have
// run.
func TestMain(m *testing.M) { servers.Main(m) }

// The dlock command's exit statuses (cmd/dlock/main.go), as the binary
// returns them.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotAcquired = 75 // EX_TEMPFAIL
	exitLeaseLost   = 124
	exitDlockFailed = 125
	exitCannotRun   = 126
	exitNotFound    = 127
)
