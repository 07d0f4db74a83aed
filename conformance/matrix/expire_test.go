package matrix_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Many clients (16, each with its own Locker, as separate processes) take
// the key with random holds while the server is made to drop the lock at
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
						_ = e.cycle(ctx, name, l, &dlock.AcquireOptions{TTL: e.ttl}, 5*time.Second, hold)
					}
				})
			}
			end := time.Now().Add(8 * time.Second)
			expired := 0
			for time.Now().Before(end) {
				time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
				ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
				begin := time.Now()
				err := e.deployment().expire(ectx, e.key)
				cancel()
				if err != nil {
					t.Fatalf("expire: %v", err)
				}
				e.h.Expire(e.key, begin, time.Now())
				expired++
			}
			t.Logf("%d expiries injected", expired)
		},
	})
}
