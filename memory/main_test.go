package memory_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the suite starts (watchdogs, loss watchers, lease
// contexts) must be gone when the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
