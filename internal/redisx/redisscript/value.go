package redisscript

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/backend"
)

// OwnerLen is the length of the ownership part that ends every lock value
// the backends write: 16 random bytes, hex-encoded (lower case).
const OwnerLen = 32

// NewValue returns a fresh lock value for a grant to holder (the holder
// description, backend.Request.Holder, which has passed
// backend.ValidateHolder): holder followed by the ownership part, OwnerLen
// hex digits of 16 bytes from crypto/rand, unique per grant. With holder
// "" the value is the ownership part alone (what the backends wrote before
// holders), at the same cost.
//
// Every script compares whole values (acquire.lua's retry check, and
// release, refresh and refreshmany), so the holder changes nothing in who
// owns the lock. The ownership part comes last, not first, because of the
// waited-for mark: acquire.lua appends '+' to a value unless it already
// ends with one, and the scripts accept v and v..'+'. A value ending with
// the holder would end with '+' for a holder such as "C++", so it would
// never be marked and its release never published (its waiters would poll);
// a value ending with hex digits ends with '+' only when it is marked, so
// the mark and the holder stay apart and [HolderOf] splits the value
// unambiguously.
func NewValue(holder string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	if holder == "" {
		return hex.EncodeToString(b[:])
	}
	var h [OwnerLen]byte
	hex.Encode(h[:], b[:])
	var s strings.Builder // one allocation: the value
	s.Grow(len(holder) + OwnerLen)
	s.WriteString(holder)
	s.Write(h[:])
	return s.String()
}

// HolderOf returns the holder description in a lock value v written by
// [NewValue] (without the waited-for mark): everything before the
// ownership part. A value that is not of that form was not written by a
// grant of the backends (it was planted under the prefix by something
// else) and has no holder: HolderOf returns "" for a value shorter than
// OwnerLen + 1, one whose last OwnerLen bytes are not lower-case hex
// digits, and one whose would-be holder fails backend.ValidateHolder (too
// long, not UTF-8, control characters: it is shown by `dlock inspect` and
// must not reach a terminal).
func HolderOf(v string) string {
	n := len(v) - OwnerLen
	if n <= 0 {
		return ""
	}
	for i := n; i < len(v); i++ {
		if c := v[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
	}
	if backend.ValidateHolder(v[:n]) != nil {
		return ""
	}
	return v[:n]
}

// SharedValue is what a lock value that is not a grant's says (the
// single-Redis backend's shared leases; see shared.lua): the key is held
// by shared leases, or reserved for writers.
type SharedValue struct {
	// Reserved: the key is reserved for writers (no holder is left, a
	// writer waits); otherwise it is held by shared leases.
	Reserved bool
	// Permits is the semaphore's size (0: readers); 0 when Reserved.
	Permits int
	// Until is the server time, in Unix milliseconds, before which new
	// shared leases stay out because a writer waits (0: none).
	Until int64
}

// ParseShared reads a lock value without its waited-for mark (as
// [Snapshot].Value holds it): NUL 's' permits ':' until for shared
// holders, NUL 'w' until for a reservation. ok is false for any other
// value (a grant's, or one planted by something else).
func ParseShared(v string) (s SharedValue, ok bool) {
	if len(v) < 3 || v[0] != 0 {
		return SharedValue{}, false
	}
	num := func(x string) (int64, bool) {
		if x == "" || strings.Trim(x, "0123456789") != "" {
			return 0, false
		}
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	switch v[1] {
	case 's':
		p, u, found := strings.Cut(v[2:], ":")
		if !found {
			return SharedValue{}, false
		}
		pn, ok1 := num(p)
		un, ok2 := num(u)
		if !ok1 || !ok2 || pn > math.MaxInt {
			return SharedValue{}, false
		}
		return SharedValue{Permits: int(pn), Until: un}, true
	case 'w':
		un, ok := num(v[2:])
		if !ok {
			return SharedValue{}, false
		}
		return SharedValue{Reserved: true, Until: un}, true
	}
	return SharedValue{}, false
}
