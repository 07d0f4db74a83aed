package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
)

func TestGuard(t *testing.T) {
	var g fence.Guard
	var value string
	write := func(v string) func() error { return func() error { value = v; return nil } }
	if err := g.Do("r", 5, write("by 5")); err != nil {
		t.Fatal(err)
	}
	if err := g.Do("r", 5, write("by 5 again")); err != nil {
		t.Errorf("the same token again: %v", err)
	}
	err := g.Do("r", 4, write("by 4"))
	var stale *fence.StaleError
	if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &stale) || stale.Highest != 5 || stale.Token != 4 {
		t.Errorf("a lower token: %v; want a StaleError (4 after 5)", err)
	}
	if value != "by 5 again" {
		t.Errorf("value %q: the stale write ran", value)
	}
	if err := g.Do("other", 1, write("other")); err != nil {
		t.Errorf("another resource: %v", err)
	}
	if err := g.Do("r", 0, write("no token")); !errors.Is(err, dlock.ErrInvalidConfig) {
		t.Errorf("token 0: %v; want ErrInvalidConfig", err)
	}
	// A failed write still raises the bar: it may have been partly
	// applied, and its token proves the lower holders lost the lock.
	boom := errors.New("boom")
	if err := g.Do("r", 9, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("failed write: %v", err)
	}
	if h := g.Highest("r"); h != 9 {
		t.Errorf("Highest after a failed write with 9 = %d, want 9", h)
	}
	if err := g.Do("r", 6, write("by 6")); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("token 6 after a failed write with 9: %v; want ErrStaleToken", err)
	}
	// Resources are checked independently: a write in progress on one
	// does not hold up another, nor deadlock a nested Do.
	if err := g.Do("outer", 1, func() error { return g.Do("inner", 1, write("nested")) }); err != nil {
		t.Errorf("nested Do on another resource: %v", err)
	}
}

// TestGuardConcurrent: many writers with random tokens; the tokens the
// resource applied never go down, and the final value is the highest
// token's.
func TestGuardConcurrent(t *testing.T) {
	var g fence.Guard
	var (
		applied []dlock.Token // under g's check
		mu      sync.Mutex    // for the race detector's sake: g serializes already
	)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 200 {
				tok := dlock.Token(rand.N(1000) + 1)
				err := g.Do("r", tok, func() error {
					mu.Lock()
					applied = append(applied, tok)
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, fence.ErrStaleToken) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for i := 1; i < len(applied); i++ {
		if applied[i] < applied[i-1] {
			t.Fatalf("write %d carried token %d after %d", i, applied[i], applied[i-1])
		}
	}
	if last := applied[len(applied)-1]; last != g.Highest("r") {
		t.Errorf("last applied %d, Highest %d", last, g.Highest("r"))
	}
}

func TestMiddleware(t *testing.T) {
	var g fence.Guard
	var body string
	h := fence.Middleware(&g, func(r *http.Request) string { return r.URL.Path }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") != "" {
			http.Error(w, "failed", http.StatusInternalServerError)
			return
		}
		body = r.URL.Query().Get("v")
	}))
	do := func(tok string, query string) int {
		r := httptest.NewRequest(http.MethodPut, "/doc?"+query, nil)
		if tok != "" {
			r.Header.Set(fence.Header, tok)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		tok, query string
		want       int
	}{
		{"", "v=none", http.StatusBadRequest},
		{"x", "v=bad", http.StatusBadRequest},
		{"0", "v=zero", http.StatusBadRequest},
		{"7", "v=seven", http.StatusOK},
		{"7", "v=seven-again", http.StatusOK},
		{"8", "v=eight", http.StatusOK},
		{"7", "v=stale", http.StatusConflict},
		{"9", "fail=1", http.StatusInternalServerError}, // raises the bar all the same
		{"8", "v=late", http.StatusConflict},
	} {
		if got := do(tc.tok, tc.query); got != tc.want {
			t.Errorf("token %q %s: status %d, want %d", tc.tok, tc.query, got, tc.want)
		}
	}
	if body != "eight" {
		t.Errorf("resource holds %q, want the last accepted write", body)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	fence.SetHeader(r.Header, 42)
	if r.Header.Get(fence.Header) != "42" {
		t.Errorf("SetHeader: %q", r.Header.Get(fence.Header))
	}
}

// noDB is a fence.DB that counts the statements it is asked to run.
type noDB struct{ calls *int }

func (d noDB) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	*d.calls++
	return nil, errors.New("noDB")
}

func (d noDB) QueryRowContext(context.Context, string, ...any) *sql.Row {
	*d.calls++
	return nil
}

// TestStoresCheckInput: SQLTable refuses token 0, an empty key and a
// missing client as every Store does (redis.FenceStore and etcd.FenceStore
// have the same test in their packages), with ErrInvalidConfig and before
// any I/O: no statement runs.
func TestStoresCheckInput(t *testing.T) {
	var stmts int
	stores := map[string][2]fence.Store{ // with a client, without
		"sql": {
			fence.SQLTable{DB: noDB{&stmts}, Table: "t", KeyColumn: "id", ValueColumn: "v"},
			fence.SQLTable{Table: "t", KeyColumn: "id", ValueColumn: "v"},
		},
	}
	for name, s := range stores {
		for _, c := range []struct {
			what  string
			store fence.Store
			key   string
			token dlock.Token
		}{
			{"token 0", s[0], "k", 0},
			{"empty key", s[0], "", 7},
			{"no client", s[1], "k", 7},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			err := c.store.Set(ctx, c.key, "v", c.token)
			cancel()
			if !errors.Is(err, dlock.ErrInvalidConfig) {
				t.Errorf("%s, %s: %v; want ErrInvalidConfig", name, c.what, err)
			}
		}
	}
	if stmts != 0 {
		t.Errorf("sql: %d statements run for refused input", stmts)
	}
}

func TestSQLTableBadNames(t *testing.T) {
	for _, st := range []fence.SQLTable{
		{Table: "t; DROP TABLE x", KeyColumn: "id", ValueColumn: "v"},
		{Table: "t", KeyColumn: "", ValueColumn: "v"},
		{Table: "t", KeyColumn: "id", ValueColumn: "v", TokenColumn: `a"b`},
	} {
		if err := st.Set(t.Context(), "k", "v", 1); !errors.Is(err, dlock.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig before any I/O", st, err)
		}
	}
}

// TestMiddlewareConcurrent: concurrent requests with random tokens; the
// handler sees tokens that never go down.
func TestMiddlewareConcurrent(t *testing.T) {
	var g fence.Guard
	var (
		mu   sync.Mutex
		seen []uint64
	)
	h := fence.Middleware(&g, func(*http.Request) string { return "doc" }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strconv.ParseUint(r.Header.Get(fence.Header), 10, 64)
		mu.Lock()
		seen = append(seen, tok)
		mu.Unlock()
	}))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 50 {
				r := httptest.NewRequest(http.MethodPut, "/doc", nil)
				fence.SetHeader(r.Header, dlock.Token(rand.N(300)+1))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK && w.Code != http.StatusConflict {
					t.Errorf("status %d", w.Code)
				}
			}
		})
	}
	wg.Wait()
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("the handler saw token %d after %d", seen[i], seen[i-1])
		}
	}
}

// TestBeyond2p53: tokens beyond 2^53, where a float64 no longer tells
// neighbours apart, keep their order in Guard and Middleware: 2^53+1 after
// 2^53 passes, 2^53 after 2^53+1 is stale. (tests/fence's TestStoreOrder
// checks the same on every store, against real servers.)
func TestBeyond2p53(t *testing.T) {
	const big = 1 << 53
	var g fence.Guard
	nop := func() error { return nil }
	if err := g.Do("r", big, nop); err != nil {
		t.Errorf("Guard: 2^53: %v", err)
	}
	if err := g.Do("r", big+1, nop); err != nil {
		t.Errorf("Guard: 2^53+1 after 2^53: %v; want it to pass", err)
	}
	if err := g.Do("r", big, nop); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("Guard: 2^53 after 2^53+1: %v; want ErrStaleToken", err)
	}
	var hg fence.Guard
	h := fence.Middleware(&hg, func(*http.Request) string { return "doc" }, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, c := range []struct {
		tok  dlock.Token
		want int
	}{{big, http.StatusOK}, {big + 1, http.StatusOK}, {big, http.StatusConflict}} {
		r := httptest.NewRequest(http.MethodPut, "/doc", nil)
		fence.SetHeader(r.Header, c.tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("Middleware: token %d: status %d, want %d", c.tok, w.Code, c.want)
		}
	}
}
