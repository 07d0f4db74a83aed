package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// etcdLock is client-go's resourcelock.Interface over one etcd key, in
// place of a coordination.k8s.io Lease on an API server (none here): the
// LeaderElectionRecord is the key's value, as JSON. As on the API server,
// whose optimistic concurrency checks an update's resourceVersion, Create
// fails if the record exists (AlreadyExists), and Update writes only if
// the key's mod revision is still the one this candidate last read or
// wrote (else Conflict); a missing record is NotFound, which the
// LeaderElector answers with Create. Get returns the stored bytes as the
// raw record: the LeaderElector compares them with the last ones it saw
// to tell that the leader renewed (the JSON of a metav1.Time has whole
// seconds, as the LeaseLock's marshalled record has).
type etcdLock struct {
	c   *clientv3.Client
	key string
	id  string

	mu   sync.Mutex
	rev  int64                   // mod revision last read or written; 0 if none
	last rl.LeaderElectionRecord // the record this candidate last wrote
}

var _ rl.Interface = (*etcdLock)(nil)

// leases is the resource named in the errors, as the LeaseLock's would.
var leases = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (l *etcdLock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	resp, err := l.c.Get(ctx, l.key)
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil, apierrors.NewNotFound(leases, l.key)
	}
	kv := resp.Kvs[0]
	var r rl.LeaderElectionRecord
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, nil, fmt.Errorf("etcdLock %s: %w", l.key, err)
	}
	l.mu.Lock()
	l.rev = kv.ModRevision
	l.mu.Unlock()
	return &r, kv.Value, nil
}

func (l *etcdLock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	return l.write(ctx, ler, clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0), func() error {
		return apierrors.NewAlreadyExists(leases, l.key)
	})
}

func (l *etcdLock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	if rev == 0 {
		return fmt.Errorf("etcdLock %s: update before the record was read or created", l.key)
	}
	return l.write(ctx, ler, clientv3.Compare(clientv3.ModRevision(l.key), "=", rev), func() error {
		return apierrors.NewConflict(leases, l.key, fmt.Errorf("the record changed since revision %d", rev))
	})
}

// write puts ler if cmp holds, else returns refused().
func (l *etcdLock) write(ctx context.Context, ler rl.LeaderElectionRecord, cmp clientv3.Cmp, refused func() error) error {
	b, err := json.Marshal(ler)
	if err != nil {
		return err
	}
	resp, err := l.c.Txn(ctx).If(cmp).Then(clientv3.OpPut(l.key, string(b))).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return refused()
	}
	l.mu.Lock()
	l.rev, l.last = resp.Header.Revision, ler
	l.mu.Unlock()
	return nil
}

// written returns the record this candidate last wrote.
func (l *etcdLock) written() rl.LeaderElectionRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

func (l *etcdLock) RecordEvent(string) {}
func (l *etcdLock) Identity() string   { return l.id }
func (l *etcdLock) Describe() string   { return "etcd:" + l.key }
