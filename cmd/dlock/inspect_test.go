package main

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// The tests of dlock inspect that run the command are in tests/dlockcmd
// (the development module).

func TestDescribe(t *testing.T) {
	for _, c := range []struct {
		info dlock.LockInfo
		want string
	}{
		{dlock.LockInfo{Waiters: -1}, "KEY k free"},
		{dlock.LockInfo{Held: true, Token: 1234, TTL: 12345 * time.Millisecond, Waiters: 2}, "KEY k held by token 1234, 12.3s left, 2 waiters"},
		{dlock.LockInfo{Held: true, Token: 7, Waiters: 0}, "KEY k held by token 7, 0 waiters"},
		{dlock.LockInfo{Held: true, TTL: time.Second, Waiters: -1}, "KEY k held, 1s left"},
	} {
		if got := describe("k", c.info); got != c.want {
			t.Errorf("describe(%+v) = %q, want %q", c.info, got, c.want)
		}
	}
	if got := describe("a b", dlock.LockInfo{}); got != `KEY "a b" free` {
		t.Errorf("describe of a key with a space = %q", got)
	}
}
