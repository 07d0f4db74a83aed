package main

import (
	"testing"

	"github.com/dlock-go/dlock/conformance/servers"
)

// TestMain removes the test servers (conformance/servers) once the tests
// have run.
func TestMain(m *testing.M) { servers.Main(m) }
