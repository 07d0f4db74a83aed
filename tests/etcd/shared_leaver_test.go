package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/tests/servers"
)

// Shared entries that are about to leave (a request that got a
// *PermitsError keeps its entry from its join until it has deleted it): see
// the grant rule in "Shared leases" in the etcd package's documentation.

// wantPermitsError fails t unless err is a *PermitsError{asked, held}.
func wantPermitsError(t *testing.T, what string, err error, asked, held int) {
	t.Helper()
	var pe *dlock.PermitsError
	if !errors.As(err, &pe) || pe.Asked != asked || pe.Held != held {
		t.Errorf("%s: %v; want a *PermitsError{Asked: %d, Held: %d}", what, err, asked, held)
	}
}

// TestSharedLeaverNotEvidence: a request C with another Permits than the
// key's holder H fails with a *PermitsError, and its entry stays in the
// queue until its delete is answered (held up here by the fault hook, as a
// slow round trip or a dead process would). Its entry is older in key
// order than H's (C's lease comes from its Locker's pool, made before H's),
// which the join's check used to take as "the key's Permits". While C is
// there:
//   - a request with H's Permits is not refused (C is not the holder), and
//     a TryAcquire of it reports the key held, not a mismatch;
//   - requests with C's Permits (TryAcquire, Acquire from another Locker)
//     fail with a *PermitsError naming H's: none is granted beside H;
//   - an Acquire with H's Permits waits for C's delete where a permit is
//     free, and is granted once C has gone.
//
// It ran red before the fix: the TryAcquire with H's Permits failed with
// PermitsError{Asked 1, Held 4}, and both requests with C's Permits were
// granted beside H, a permit of 1 (three valid leases on the key).
func TestSharedLeaverNotEvidence(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	admin := newClient(t, eps)
	for _, c := range []struct{ holder, leaver int }{
		{1, 4}, // a permit of 1 held; a permit of 4 leaving
		{0, 4}, // a reader holds; a permit of 4 leaving
		{4, 1}, // a permit of 4 held; a permit of 1 leaving
	} {
		t.Run(fmt.Sprintf("holder%d-leaver%d", c.holder, c.leaver), func(t *testing.T) {
			const ttl = 30 * time.Second
			dC, err := etcd.NewDriver(t.Context(), newClient(t, eps), nil)
			if err != nil {
				t.Fatal(err)
			}
			lc := mustNew(t, dC, nil)
			t.Cleanup(func() { _ = lc.Close() })
			h, d, e := newLocker(t, eps, nil), newLocker(t, eps, nil), newLocker(t, eps, nil)
			key := uniqueKey(t)

			// 1. C's Locker keeps an idle lease older than every lease
			// granted below.
			warm, err := lc.Acquire(t.Context(), uniqueKey(t), permitOf(c.leaver, ttl))
			if err != nil {
				t.Fatal(err)
			}
			if err := warm.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := poolSize(dC); n != 1 {
				t.Fatalf("C's pool holds %d leases, want 1", n)
			}
			// 2. H holds.
			hl, err := h.Acquire(t.Context(), key, permitOf(c.holder, ttl))
			if err != nil {
				t.Fatal(err)
			}
			// 3. C asks for another Permits and fails; its leave is held
			// up until release is closed.
			release, leaving := make(chan struct{}), make(chan struct{}, 1)
			injectFault(dC, func(doing string, _ clientv3.LeaseID) error {
				if doing == "leaving the queue" {
					select {
					case leaving <- struct{}{}:
					default:
					}
					<-release
				}
				return nil
			})
			t.Cleanup(func() { injectFault(dC, nil) })
			cErr := make(chan error, 1)
			go func() {
				_, err := lc.Acquire(t.Context(), key, permitOf(c.leaver, ttl))
				cErr <- err
			}()
			select {
			case <-leaving:
			case err := <-cErr:
				close(release)
				t.Fatalf("C's Acquire ended without leaving the queue: %v", err)
			case <-time.After(slack):
				close(release)
				t.Fatal("C did not leave the queue")
			}
			released := false
			unblock := func() {
				if !released {
					released = true
					close(release)
				}
			}
			defer unblock()
			queueLen(t, admin, key, 2)

			// 4. H's Permits: not refused.
			_, err = d.TryAcquire(t.Context(), key, permitOf(c.holder, ttl))
			var pe *dlock.PermitsError
			if errors.As(err, &pe) || !errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("TryAcquire with the holder's Permits %d while C (Permits %d) leaves: %v; want ErrNotAcquired, not a mismatch",
					c.holder, c.leaver, err)
			}
			// 5, 6. C's Permits: refused, by TryAcquire and by Acquire on
			// another Locker, at once.
			var granted []*dlock.Lease
			le, err := d.TryAcquire(t.Context(), key, permitOf(c.leaver, ttl))
			if le != nil {
				granted = append(granted, le)
			}
			wantPermitsError(t, fmt.Sprintf("TryAcquire with the leaver's Permits %d", c.leaver), err, c.leaver, c.holder)
			actx, cancel := context.WithTimeout(t.Context(), slack)
			le, err = e.Acquire(actx, key, permitOf(c.leaver, ttl))
			cancel()
			if le != nil {
				granted = append(granted, le)
			}
			wantPermitsError(t, fmt.Sprintf("Acquire with the leaver's Permits %d", c.leaver), err, c.leaver, c.holder)
			if len(granted) > 0 {
				t.Errorf("%d leases with Permits %d granted beside a holder of Permits %d", len(granted), c.leaver, c.holder)
			}
			for _, le := range granted {
				_ = le.Release(t.Context())
			}

			// An Acquire with H's Permits waits for C's delete.
			fch := make(chan acquired, 1)
			go func() {
				le, err := e.Acquire(t.Context(), key, permitOf(c.holder, ttl))
				fch <- acquired{le, err}
			}()
			queueLen(t, admin, key, 3)
			select {
			case f := <-fch:
				t.Fatalf("an Acquire with the holder's Permits was answered while C was leaving: %v", f.err)
			case <-time.After(300 * time.Millisecond):
			}
			unblock()
			wantPermitsError(t, "C's Acquire", <-cErr, c.leaver, c.holder)
			free := c.holder == 0 || c.holder > 1 // a permit is free beside H
			var f acquired
			if free {
				select {
				case f = <-fch:
				case <-time.After(slack):
					t.Fatalf("the Acquire with the holder's Permits %d was not granted after C left", c.holder)
				}
			} else {
				select {
				case f = <-fch:
					t.Fatalf("a second permit of 1 was granted: %v", f.err)
				case <-time.After(200 * time.Millisecond):
				}
			}
			if err := hl.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if !free {
				f = <-fch
			}
			if f.err != nil {
				t.Fatalf("the Acquire with the holder's Permits: %v", f.err)
			}
			if f.le.Token() <= hl.Token() {
				t.Errorf("token %d after the holder's %d", f.le.Token(), hl.Token())
			}
			if err := f.le.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			queueLen(t, admin, key, 0)
		})
	}
}

// TestSharedMixedPermits: clients of several Lockers ask one key, at
// random, for a permit of 1 or of 3, a reader's lease or (now and then)
// the writer's, mostly with TryAcquire (so that the queue empties now and
// then and the key changes hands between kinds), else with Acquire for at
// most half a second, and hold briefly. Many shared requests fail with a
// *PermitsError, and their entries leave the queue a round trip later: no
// two leases with different Permits (or a writer and any other) are ever
// held together, and never more than Permits of one Permits. Holders are
// counted in process: from Acquire's return to the call of Release, the
// lease is valid (TTLs are far longer than the run).
//
// On the code before the fix, it found 5 to 10 grants beside a holder of
// another Permits in its 6 s (a permit of 3 beside a permit of 1, a
// permit of 1 beside readers, ...).
func TestSharedMixedPermits(t *testing.T) {
	t.Parallel()
	eps := servers.Etcd(t, 1).Endpoints()
	const clients, run = 16, 6 * time.Second
	ls := lockers(t, eps, 4)
	key := uniqueKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		held       = map[int]int{} // shared holders by Permits
		writers    int
		grants     = map[string]int{}
		mismatches int
		violations int
		last       = -2 // the Permits of the last grant (-1: a writer)
		changes    int  // grants of another kind than the last
	)
	name := func(p int) string {
		switch p {
		case -1:
			return "writer"
		case 0:
			return "reader"
		}
		return fmt.Sprintf("permit of %d", p)
	}
	end := time.Now().Add(run)
	for i := range clients {
		l := ls[i%len(ls)]
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				p := []int{1, 3, 0, 1, 3, 0, 1, 3, -1}[rand.IntN(9)]
				o := &dlock.AcquireOptions{TTL: time.Minute}
				if p >= 0 {
					o = permitOf(p, time.Minute)
				}
				var le *dlock.Lease
				var err error
				if rand.IntN(4) > 0 {
					le, err = l.TryAcquire(ctx, key, o)
				} else {
					actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
					le, err = l.Acquire(actx, key, o)
					acancel()
				}
				var pe *dlock.PermitsError
				switch {
				case errors.As(err, &pe):
					mu.Lock()
					mismatches++
					mu.Unlock()
					continue
				case errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil:
					continue
				case err != nil:
					t.Errorf("client %d: %s: %v", i, name(p), err)
					return
				}
				mu.Lock()
				var others []string
				if writers > 0 {
					others = append(others, fmt.Sprintf("%d writers", writers))
				}
				for q, n := range held {
					if n > 0 && (q != p || p == -1) {
						others = append(others, fmt.Sprintf("%d of %s", n, name(q)))
					}
				}
				if p == -1 {
					writers++
				} else {
					held[p]++
				}
				if len(others) > 0 || p > 0 && held[p] > p {
					violations++
					if violations <= 5 {
						t.Errorf("a %s (token %d) granted while %v held (and %d of its own Permits)", name(p), le.Token(), others, held[max(p, 0)])
					}
				}
				grants[name(p)]++
				if p != last {
					changes++
					last = p
				}
				mu.Unlock()
				time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
				mu.Lock()
				if p == -1 {
					writers--
				} else {
					held[p]--
				}
				mu.Unlock()
				if err := le.Release(ctx); err != nil {
					t.Errorf("client %d: Release: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("grants %v, %d changes of kind between grants, %d PermitsErrors, %d violations", grants, changes, mismatches, violations)
	if kinds := len(grants); kinds < 3 || changes < 10 || mismatches == 0 {
		t.Errorf("%d kinds granted, %d changes of kind between grants, %d PermitsErrors: the mix did not mix", kinds, changes, mismatches)
	}
	hn := &harness{admin: newClient(t, eps)}
	deadline := time.Now().Add(slack)
	for {
		res, err := hn.Residue(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if !res {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue still has %d entries after the run", entries(t, hn.admin, key))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
