package failover

// The candidate side: the test binary run again with candidateEnv set is one
// candidate of one election, and nothing else (TestMain). It reports on
// stdout, one line each, as the parent (failover_test.go) reads them:
//
//	campaigning        about to campaign (connected, the lock set up)
//	leading TERM       elected: the lead function or callback was called
//	stopped            leadership ended (the parent does not wait for it)
//	error TEXT         the candidate failed; it exits with status 1

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd"
	_ "github.com/dlock-go/dlock/redis"
	_ "github.com/dlock-go/dlock/redlock"
	_ "github.com/dlock-go/dlock/zookeeper"
)

// candidateEnv holds the JSON candidateSpec of a candidate process.
const candidateEnv = "DLOCK_FAILOVER_CANDIDATE"

// The libraries a candidate can run.
const (
	libDlock    = "dlock"         // dlock.Election
	libEtcd     = "etcd-election" // go.etcd.io/etcd/client/v3/concurrency.Election
	libClientGo = "client-go"     // k8s.io/client-go/tools/leaderelection
)

// candidateSpec is what a candidate process runs.
type candidateSpec struct {
	Lib string
	// URL is the dlock Locker's URL (libDlock).
	URL string
	// Endpoints are the etcd server's (libEtcd, libClientGo).
	Endpoints []string
	// Key is the election's key (dlock), prefix (etcd) or record key
	// (client-go).
	Key string
	// ID identifies the candidate: the dlock holder description, the
	// etcd campaign value, client-go's identity.
	ID string
	// TTL is the dlock Election's TTL (libDlock).
	TTL time.Duration
	// Lease is the lease time: etcd's Session TTL (whole seconds),
	// client-go's LeaseDuration (RenewDeadline and RetryPeriod follow).
	Lease time.Duration
}

// runCandidate runs the candidate the JSON spec describes until it is
// killed or its stdin is closed (the parent died), and returns the
// process's exit status.
func runCandidate(spec string) int {
	var s candidateSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		say("error %s: %v", candidateEnv, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The parent holds our stdin open: EOF means it is gone, and a
	// candidate must not outlive it.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var err error
	switch s.Lib {
	case libDlock:
		err = candidateDlock(ctx, s)
	case libEtcd:
		err = candidateEtcd(ctx, s)
	case libClientGo:
		err = candidateClientGo(ctx, s)
	default:
		err = fmt.Errorf("unknown library %q", s.Lib)
	}
	if err != nil && ctx.Err() == nil {
		say("error %v", err)
		return 1
	}
	return 0
}

// say writes one report line on stdout, unbuffered: the parent
// timestamps it as it arrives.
func say(format string, args ...any) {
	_, _ = fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// candidateDlock campaigns with a dlock.Election on s.URL.
func candidateDlock(ctx context.Context, s candidateSpec) error {
	l, err := dlock.Open(ctx, s.URL)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	e, err := dlock.NewElection(l, s.Key, &dlock.ElectionOptions{TTL: s.TTL, Holder: s.ID})
	if err != nil {
		return err
	}
	say("campaigning")
	return e.Run(ctx, func(ctx context.Context, le *dlock.Lease) error {
		say("leading %d", le.Token())
		<-ctx.Done()
		say("stopped")
		return nil
	})
}

// newEtcdClient returns a client of endpoints, its logging silenced.
func newEtcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// candidateEtcd campaigns with etcd's concurrency.Election, on a Session
// whose lease has TTL s.Lease (whole seconds, as etcd counts).
func candidateEtcd(ctx context.Context, s candidateSpec) error {
	c, err := newEtcdClient(s.Endpoints)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	sess, err := concurrency.NewSession(c, concurrency.WithTTL(int(s.Lease/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer func() { _ = sess.Close() }()
	e := concurrency.NewElection(sess, s.Key)
	say("campaigning")
	if err := e.Campaign(ctx, s.ID); err != nil {
		return err
	}
	say("leading %d", e.Rev())
	select {
	case <-sess.Done():
		say("stopped")
		return fmt.Errorf("etcd session ended")
	case <-ctx.Done():
		return nil
	}
}

// candidateClientGo campaigns with client-go's LeaderElector on the etcd
// stand-in for a Lease object (etcdLock), with LeaseDuration s.Lease and
// RenewDeadline and RetryPeriod in client-go's usual proportions (15 s /
// 10 s / 2 s).
func candidateClientGo(ctx context.Context, s candidateSpec) error {
	c, err := newEtcdClient(s.Endpoints)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	// klog's lines would go to stderr, which the parent shows only when
	// a run fails; keep them to warnings and errors.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	lock := &etcdLock{c: c, key: s.Key, id: s.ID}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: s.Lease,
		RenewDeadline: s.Lease * 10 / 15,
		RetryPeriod:   s.Lease * 2 / 15,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { say("leading %d", lock.written().LeaderTransitions) },
			OnStoppedLeading: func() { say("stopped") },
		},
		Name: s.Key,
	})
	if err != nil {
		return err
	}
	say("campaigning")
	le.Run(ctx) // returns when leadership is lost, or ctx ends
	if ctx.Err() == nil {
		return fmt.Errorf("client-go: leadership lost")
	}
	return nil
}
