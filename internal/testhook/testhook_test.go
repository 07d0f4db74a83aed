package testhook_test

import (
	"testing"

	"github.com/dlock-go/dlock/internal/testhook"
)

func TestSetGet(t *testing.T) {
	testhook.Set("testhook.double", func(n int) int { return 2 * n })
	if got := testhook.Get[func(int) int]("testhook.double")(21); got != 42 {
		t.Errorf("Get(...)(21) = %d, want 42", got)
	}
	for name, get := range map[string]func(){
		"missing":    func() { testhook.Get[func(int) int]("testhook.none") },
		"wrong type": func() { testhook.Get[func() int]("testhook.double") },
		"twice":      func() { testhook.Set("testhook.double", 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			get()
		}()
	}
}
