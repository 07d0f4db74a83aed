// Package fencecheck holds what every fencing store shares: the input
// check made before any I/O and the token encoding, so that the stores of
// package fence and the etcd module's etcd.FenceStore refuse the same
// input the same way and write tokens in one format.
package fencecheck

import (
	"fmt"

	"github.com/dlock-go/dlock/backend"
)

// Set is the input check every store's Set makes before any I/O: token 0
// (a backend with no fencing tokens), an empty key and a missing client
// are refused with backend.ErrInvalidConfig.
func Set(store, key string, token uint64, noClient bool) error {
	switch {
	case token == 0:
		return NoToken(key)
	case key == "":
		return fmt.Errorf("%w: fence: %s: empty key", backend.ErrInvalidConfig, store)
	case noClient:
		return fmt.Errorf("%w: fence: %s: no client", backend.ErrInvalidConfig, store)
	}
	return nil
}

// NoToken is the error for a write carrying token 0 to resource.
func NoToken(resource string) error {
	return fmt.Errorf("%w: fence: %q: token 0: the lock's backend issues no fencing tokens", backend.ErrInvalidConfig, resource)
}

// Padded writes a token as 20 decimal digits, so that comparing the
// strings compares the numbers (a store's string comparison orders them).
func Padded(t uint64) string { return fmt.Sprintf("%020d", t) }

// Unpad reads a token written by Padded (0 if s is not one).
func Unpad(s string) uint64 {
	var n uint64
	_, _ = fmt.Sscanf(s, "%d", &n)
	return n
}
