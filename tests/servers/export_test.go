package servers

import "context"

// CheckFaketime exposes checkFaketime to the external tests: it fails with
// ErrNoFaketime on a server without libfaketime loaded.
func CheckFaketime(ctx context.Context, s *Server) error { return s.checkFaketime(ctx) }

// Owner is the value of this process's containers' owner label
// (dlock.test.owner).
var Owner = owner

// FreePort and StaticPorts expose freePort and staticPorts.
var FreePort, StaticPorts = freePort, staticPorts
