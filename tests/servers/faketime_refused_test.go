package servers_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

// TestFaketimeRefused: ShiftClock on a server not started by
// StartRedisFaketime fails, and a server without libfaketime is recognised
// (ErrNoFaketime), as on an image without the package.
func TestFaketimeRefused(t *testing.T) {
	s := servers.Redis(t, 1)[0]
	if err := s.ShiftClock(t.Context(), time.Minute); err == nil {
		t.Fatal("ShiftClock on a plain Redis server succeeded")
	}
	if err := servers.CheckFaketime(t.Context(), s); !errors.Is(err, servers.ErrNoFaketime) {
		t.Fatalf("check of a plain Redis server = %v; want ErrNoFaketime", err)
	}
}
