package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
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
		{dlock.LockInfo{Held: true, Token: 1234, Holder: "web-3/4242", TTL: 12345 * time.Millisecond, Waiters: 2},
			"KEY k held by token 1234, holder web-3/4242, 12.3s left, 2 waiters"},
		{dlock.LockInfo{Held: true, Holder: "web-3/4242", Waiters: -1}, "KEY k held, holder web-3/4242"},
		// Quoted, with escapes, when not one plainly printable word: a
		// space, a double quote, a right-to-left override (U+202E, not
		// refused by ValidateHolder, but a server may hold it), and
		// what a server could plant past the library's validation.
		{dlock.LockInfo{Held: true, Token: 7, Holder: "deploy job 7", Waiters: -1}, `KEY k held by token 7, holder "deploy job 7"`},
		{dlock.LockInfo{Held: true, Token: 7, Holder: `"x"`, Waiters: -1}, `KEY k held by token 7, holder "\"x\""`},
		{dlock.LockInfo{Held: true, Token: 7, Holder: "web‮3", Waiters: -1}, `KEY k held by token 7, holder "web\u202e3"`},
		{dlock.LockInfo{Held: true, Token: 7, Holder: "web\x1b[2J\n", Waiters: -1}, `KEY k held by token 7, holder "web\x1b[2J\n"`},
		{dlock.LockInfo{Holder: "gone", Waiters: -1}, "KEY k free"},
		// Shared leases: every holder, oldest first, and the permits.
		{dlock.LockInfo{Held: true, Token: 17, Holder: "web-3/4242", TTL: 12345 * time.Millisecond, Waiters: 5, Shared: true, Permits: 4,
			Holders: []backend.Holding{{Token: 17, Holder: "web-3/4242", TTL: 12345 * time.Millisecond}, {Token: 19, Holder: "web 4", TTL: 14 * time.Second}}},
			`KEY k held by 2 of 4 permits: token 17, holder web-3/4242, 12.3s left; token 19, holder "web 4", 14s left, 5 waiters`},
		{dlock.LockInfo{Held: true, Token: 20, Waiters: -1, Shared: true, Holders: []backend.Holding{{Token: 20}}}, "KEY k held by 1 reader: token 20"},
		{dlock.LockInfo{Held: true, Waiters: -1, Shared: true, Holders: []backend.Holding{{TTL: time.Second}, {}}}, "KEY k held by 2 readers: 1s left; unknown"},
	} {
		if got := describe("k", c.info); got != c.want {
			t.Errorf("describe(%+v) = %q, want %q", c.info, got, c.want)
		}
	}
	if got := describe("a b", dlock.LockInfo{}); got != `KEY "a b" free` {
		t.Errorf("describe of a key with a space = %q", got)
	}
}

// TestInspectJSON: --json's holder is the description, null when the
// holder gave none (or the backend does not keep it); escapes are JSON's.
func TestInspectJSON(t *testing.T) {
	for _, c := range []struct {
		info dlock.LockInfo
		want string
	}{
		{dlock.LockInfo{Waiters: -1}, `{"key":"k","held":false,"token":null,"holder":null,"ttl_seconds":null,"waiters":null,"shared":false,"permits":null,"holders":[]}`},
		{dlock.LockInfo{Held: true, Token: 12, Holder: "web-3/4242", TTL: 1500 * time.Millisecond, Waiters: 0},
			`{"key":"k","held":true,"token":12,"holder":"web-3/4242","ttl_seconds":1.5,"waiters":0,"shared":false,"permits":null,"holders":[{"token":12,"holder":"web-3/4242","ttl_seconds":1.5}]}`},
		{dlock.LockInfo{Held: true, Token: 12, Waiters: -1}, `{"key":"k","held":true,"token":12,"holder":null,"ttl_seconds":null,"waiters":null,"shared":false,"permits":null,"holders":[{"token":12,"holder":null,"ttl_seconds":null}]}`},
		{dlock.LockInfo{Held: true, Holder: "a \"b\"\x1b<", Waiters: -1},
			`{"key":"k","held":true,"token":null,"holder":"a \"b\"\u001b\u003c","ttl_seconds":null,"waiters":null,"shared":false,"permits":null,"holders":[{"token":null,"holder":"a \"b\"\u001b\u003c","ttl_seconds":null}]}`},
		{dlock.LockInfo{Held: true, Token: 17, TTL: time.Second, Waiters: 1, Shared: true, Permits: 4,
			Holders: []backend.Holding{{Token: 17, TTL: time.Second}, {Token: 18, Holder: "w"}}},
			`{"key":"k","held":true,"token":17,"holder":null,"ttl_seconds":1,"waiters":1,"shared":true,"permits":4,"holders":[{"token":17,"holder":null,"ttl_seconds":1},{"token":18,"holder":"w","ttl_seconds":null}]}`},
	} {
		b, err := json.Marshal(toJSON("k", c.info))
		if err != nil || string(b) != c.want {
			t.Errorf("toJSON(%+v) = %s (%v), want %s", c.info, b, err, c.want)
		}
	}
}
