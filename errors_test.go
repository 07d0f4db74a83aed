package dlock_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memory"
)

// TestOpErrorBoundsKey: an error names a key dlock accepts in full, and a
// longer one by its first 64 bytes (cut on a character boundary) and its
// length, so that a 2,000-byte key is not echoed whole.
func TestOpErrorBoundsKey(t *testing.T) {
	l, err := memory.New(memory.NewStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	long := strings.Repeat("a", 2000)
	_, err = l.TryAcquire(t.Context(), long, nil)
	if !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquire of a 2000-byte key: %v, want ErrInvalidKey", err)
	}
	want := `dlock: try-acquire "` + strings.Repeat("a", 64) + `…" (2000 bytes): invalid key: 2000 bytes, longer than 512`
	if got := err.Error(); got != want {
		t.Errorf("error of a 2000-byte key:\n got %q\nwant %q", got, want)
	}

	// A cut that would split a character keeps it whole or leaves it out.
	key := "k" + strings.Repeat("é", 300) // 601 bytes: the 64th is the first half of an é
	msg := (&dlock.OpError{Op: "acquire", Key: key, Err: dlock.ErrNotAcquired}).Error()
	if !utf8.ValidString(msg) || !strings.Contains(msg, `"k`+strings.Repeat("é", 31)+`…" (601 bytes)`) {
		t.Errorf("error of a 601-byte key of 2-byte characters: %q, want its first 63 bytes and its length", msg)
	}

	// Keys dlock accepts are shown whole, as before.
	for _, k := range []string{"orders/42", strings.Repeat("b", dlock.MaxKeyLen)} {
		msg := (&dlock.OpError{Op: "release", Key: k, Err: dlock.ErrNotHeld}).Error()
		if want := `dlock: release "` + k + `": lock not held`; msg != want {
			t.Errorf("Error() = %q, want %q", msg, want)
		}
	}
}
