package matrix_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance/check"
)

// Many clients (16, each with its own Locker, as separate processes; half
// wait, half try and retry) take the key with random holds while the server is made to drop the lock at
// random moments, mostly during critical sections. A dropped lease is no
// longer valid, so the holder that goes on writes late; its token must let
// the fenced register refuse it, and the next holder's token must be
// larger.
func init() {
	register(&scenario{
		order:   70,
		name:    "ManyClientsExpire",
		row:     "16 clients, random holds, lock dropped by the server during critical sections",
		applies: all,
		expect:  expectIf(withoutTokens, violation, "without tokens the register cannot refuse the holder whose lock was dropped"),
		run: func(t *testing.T, e *env) {
			const clients = 16
			ctx := t.Context()
			for i := range clients {
				l := e.locker()
				name := fmt.Sprintf("c%02d", i)
				e.goStop(func(stop <-chan struct{}) {
					for {
						select {
						case <-stop:
							return
						default:
						}
						hold := time.Duration(rand.IntN(20)) * time.Millisecond
						if i%2 == 0 {
							_ = e.cycle(ctx, name, l, &dlock.AcquireOptions{TTL: e.ttl}, 5*time.Second, hold)
						} else if e.cycle(ctx, name, l, &dlock.AcquireOptions{TTL: e.ttl}, 0, hold) != nil {
							time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
						}
					}
				})
			}
			const minDropped, minValid = 10, 50
			// 8 s of faults, longer (up to 30 s) on a loaded machine until
			// minDropped locks were dropped: a drop needs the lock held
			// at the moment the admin reads the queue.
			start := time.Now()
			end, hardEnd := start.Add(8*time.Second), start.Add(30*time.Second)
			expired := 0
			for now := time.Now(); now.Before(end) || (expired < minDropped && now.Before(hardEnd)); now = time.Now() {
				time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond)
				ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
				begin := time.Now()
				dropped, tok, err := e.deployment().expire(ectx, e.key)
				cancel()
				if err != nil {
					t.Fatalf("expire: %v", err)
				}
				if dropped {
					e.h.Expire(e.key, tok, begin, time.Now())
					expired++
				}
			}
			// A lease dropped before its acquire returned was never
			// valid; and where the expiry cannot name the lock it
			// dropped (Redlock), every lease pending at an expiry may
			// be the one, and is cut before its grant: the exclusion
			// check cannot see either. Half the clients use TryAcquire
			// (rarely pending at an expiry) so that enough leases stay
			// visible; a cell that checks too few fails.
			e.stopAll()
			valid, spans, never := 0, check.Validity(e.h), map[string]int{}
			for _, sp := range spans {
				if sp.Valid() {
					valid++
				} else {
					never[sp.Why]++
				}
			}
			t.Logf("%d locks dropped in %v; %d of %d leases valid for a while; never valid, by what ended them: %v",
				expired, time.Since(start).Round(time.Millisecond), valid, len(spans), never)
			if expired < minDropped {
				t.Errorf("only %d locks dropped (want %d): the fault hardly happened", expired, minDropped)
			}
			if valid < minValid {
				t.Errorf("only %d of %d leases were valid for a while (want %d): the cell checked too little", valid, len(spans), minValid)
			}
		},
	})
}
