package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/redis"
)

// roundTrips counts the scripts a client sends: alone (commands), or in
// pipelines (with the scripts in them). Other commands (a new connection's
// HELLO and CLIENT SETINFO) are not counted.
type roundTrips struct {
	mu                        sync.Mutex
	commands, pipelines, cmds int
	keys                      int64 // of the scripts in pipelines
	// refused, refusedCmds: pipelines (and their scripts) whose every
	// script met NOSCRIPT: the server ran none of them (a script cache
	// flushed, perhaps by a test running in parallel on the server), and
	// the driver sends them again.
	refused, refusedCmds int
}

func (h *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if isScript(cmd) {
			h.mu.Lock()
			h.commands++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		n, keys := 0, int64(0)
		for _, cmd := range cmds {
			if isScript(cmd) {
				n++
				k, _ := strconv.ParseInt(fmt.Sprint(cmd.Args()[2]), 10, 64) // numkeys
				keys += k
			}
		}
		err := next(ctx, cmds)
		if n > 0 {
			noscript := 0
			for _, cmd := range cmds {
				if isScript(cmd) && goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
					noscript++
				}
			}
			h.mu.Lock()
			h.pipelines++
			h.cmds += n
			h.keys += keys
			if noscript == n {
				h.refused++
				h.refusedCmds += n
			}
			h.mu.Unlock()
		}
		return err
	}
}

func isScript(cmd goredis.Cmder) bool {
	name := cmd.Name()
	return name == "evalsha" || name == "eval"
}

func (h *roundTrips) counts() (commands, pipelines, cmds int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.commands, h.pipelines, h.cmds
}

// served is counts less the pipelines the server refused whole (NOSCRIPT).
func (h *roundTrips) served() (commands, pipelines, cmds int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.commands, h.pipelines - h.refused, h.cmds - h.refusedCmds
}

func (h *roundTrips) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commands, h.pipelines, h.cmds, h.keys = 0, 0, 0, 0
	h.refused, h.refusedCmds = 0, 0
}

func (h *roundTrips) keysInPipelines() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys
}

// TestRefreshBatch: the Driver is a backend.BatchRefresher; one call
// refreshes every lease in one round trip (one pipeline; on a single
// server, one script for all of them), each with the meaning of
// Lease.Refresh: ours extended (and the TTL granted reported), released or
// stolen ones ErrNotHeld and left alone, a bad TTL ErrInvalidTTL before any
// I/O. After the script cache is flushed, it still refreshes (EVAL).
// TestConformanceCluster runs it on a Cluster client too.
func TestRefreshBatch(t *testing.T) {
	t.Parallel()
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	testRefreshBatch(t, c, serverClient(t), 1)
}

// testRefreshBatch runs TestRefreshBatch on c (admin: a client of the same
// server), where RefreshBatch of 49 leases should send scripts scripts.
func testRefreshBatch(t *testing.T, c goredis.UniversalClient, admin *goredis.Client, scripts int) {
	hook := new(roundTrips)
	c.AddHook(hook)
	d := newDriver(t, c, nil)
	br, ok := any(d).(backend.BatchRefresher)
	if !ok {
		t.Fatal("*redis.Driver does not implement backend.BatchRefresher")
	}

	const n = 50
	keys := make([]string, n)
	leases := make([]backend.Lease, n)
	for i := range leases {
		keys[i] = uniqueKey(t)
		l, err := d.TryAcquire(t.Context(), backend.Request{Key: keys[i], TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	const released, stolen, badTTL = 3, 7, 11
	if err := leases[released].Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Expired and taken by someone else since.
	if err := admin.Set(t.Context(), lockKey(keys[stolen]), "another holder", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	refresh := func(ttl time.Duration) []backend.RefreshRequest {
		reqs := make([]backend.RefreshRequest, n)
		for i, l := range leases {
			reqs[i] = backend.RefreshRequest{Lease: l, TTL: ttl}
		}
		reqs[badTTL].TTL = time.Microsecond
		hook.reset()
		br.RefreshBatch(t.Context(), reqs)
		return reqs
	}
	check := func(reqs []backend.RefreshRequest, ttl time.Duration) {
		t.Helper()
		for i, r := range reqs {
			switch i {
			case released, stolen:
				if !errors.Is(r.Err, backend.ErrNotHeld) || r.Granted != 0 {
					t.Errorf("lease %d (not ours): Granted %v, Err %v; want ErrNotHeld", i, r.Granted, r.Err)
				}
			case badTTL:
				if !errors.Is(r.Err, backend.ErrInvalidTTL) {
					t.Errorf("lease %d (1µs TTL): Err %v, want ErrInvalidTTL", i, r.Err)
				}
			default:
				if r.Err != nil || r.Granted != ttl.Truncate(time.Millisecond) {
					t.Errorf("lease %d: Granted %v, Err %v; want %v", i, r.Granted, r.Err, ttl.Truncate(time.Millisecond))
					continue
				}
				if pttl := admin.PTTL(t.Context(), lockKey(keys[i])).Val(); pttl <= 5*time.Second || pttl > ttl {
					t.Errorf("lease %d: PTTL %v after the refresh to %v", i, pttl, ttl)
				}
			}
		}
		if v := admin.Get(t.Context(), lockKey(keys[stolen])).Val(); v != "another holder" {
			t.Errorf("the stolen lock's value is %q", v)
		}
		if pttl := admin.PTTL(t.Context(), lockKey(keys[stolen])).Val(); pttl > time.Minute {
			t.Errorf("the stolen lock's PTTL is %v, above its own minute", pttl)
		}
		if n, _ := admin.Exists(t.Context(), lockKey(keys[released])).Result(); n != 0 {
			t.Error("the released lock was re-created")
		}
	}

	const ttl = 20*time.Second + 500*time.Microsecond
	reqs := refresh(ttl)
	check(reqs, ttl)
	// A pipeline refused whole with NOSCRIPT (a test running in parallel
	// on this server flushes the script cache) is not counted: it is sent
	// again.
	if commands, pipelines, cmds := hook.served(); commands != 0 || pipelines != 1 || cmds != scripts {
		t.Errorf("RefreshBatch of %d leases (one with a bad TTL): %d scripts alone, %d pipelines with %d scripts served; want 0, 1, %d",
			n, commands, pipelines, cmds, scripts)
	}

	// A flushed script cache (a restart, a failover): refused, then sent
	// again with EVAL.
	if err := admin.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	reqs = refresh(30 * time.Second)
	check(reqs, 30*time.Second)

	// A cancelled context: every request gets ErrUnavailable and ctx.Err().
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	reqs = make([]backend.RefreshRequest, 2)
	for i := range reqs {
		reqs[i] = backend.RefreshRequest{Lease: leases[i], TTL: time.Minute}
	}
	br.RefreshBatch(ctx, reqs)
	for i, r := range reqs {
		if !errors.Is(r.Err, backend.ErrUnavailable) || !errors.Is(r.Err, context.Canceled) {
			t.Errorf("cancelled: request %d: Err %v, want ErrUnavailable and context.Canceled", i, r.Err)
		}
	}
	for _, l := range leases {
		_ = l.Release(t.Context())
	}
}

// TestTenThousandAutoRefreshed: 10,000 auto-refreshed leases on one Locker
// at TTL 3 s are refreshed in pipelines (no refresh goes alone) and none
// is lost over several refresh periods.
func TestTenThousandAutoRefreshed(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 leases: not in -short")
	}
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	hook := new(roundTrips)
	c.AddHook(hook)
	l, err := redis.New(t.Context(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })

	const n = 10000
	prefix := uniqueKey(t)
	ao := &dlock.AcquireOptions{TTL: 3 * time.Second, AutoRefresh: true, MaxHold: time.Hour}
	leases := make([]*dlock.Lease, n)
	var (
		wg   sync.WaitGroup
		errs = make(chan error, 16)
	)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				le, err := l.TryAcquire(t.Context(), fmt.Sprintf("%s/%d", prefix, i), ao)
				if err != nil {
					errs <- err
					return
				}
				leases[i] = le
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	start := time.Now()
	hook.reset()
	// Four TTLs: every lease is refreshed about 12 times (every TTL/3).
	hold := 4 * ao.TTL
	for time.Since(start) < hold {
		for i, le := range leases {
			select {
			case <-le.Done():
				t.Fatalf("lease %d of %d lost after %v: %v", i, n, time.Since(start).Round(time.Millisecond), le.Err())
			default:
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	commands, pipelines, cmds := hook.counts()
	refreshed := hook.keysInPipelines()
	t.Logf("%d leases over %v: %d refreshes in %d scripts in %d pipelines, %d scripts alone", n, hold, refreshed, cmds, pipelines, commands)
	if refreshed < 2*n {
		t.Errorf("%d refreshes in pipelines in %v, want at least %d (every lease refreshed at least twice)", refreshed, hold, 2*n)
	}
	if commands > n/100 {
		t.Errorf("%d scripts alone while %d leases were refreshed, want the refreshes in pipelines", commands, n)
	}
	for i, le := range leases {
		if err := le.Release(t.Context()); err != nil {
			t.Fatalf("Release of lease %d: %v", i, err)
		}
	}
}
