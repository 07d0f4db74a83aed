package etcd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Inspector = (*Driver)(nil)

// Inspect implements backend.Inspector. It reads key's queue (the keys
// under its directory, by create revision): the first is the holder, its
// create revision the token, its value the holder description
// (LockInfo.Holder: the acquire's backend.Request.Holder, at most
// backend.MaxHolderLen bytes, written with the key), the time left on its
// etcd lease the TTL (whole seconds, from LeaseTimeToLive), and the others
// are the waiters. It reads one value, the holder's (its lease is in the
// same record; a keys-only read would leave both out); it writes nothing.
//
// When the first entry is shared (a permit or a reader), the holders are
// the entries the grant rule grants (see the package documentation), read
// at the same revision in one more read (two for readers), and each
// holder's lease is read (LeaseTimeToLive, at most 16 at once):
// LockInfo.Holders lists them, oldest first, with LockInfo.Shared and
// Permits set; Waiters counts the other entries.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	dir := d.dir(key)
	resp, err := d.get(ctx, "reading the queue", dir,
		clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return backend.LockInfo{}, err
	}
	if len(resp.Kvs) == 0 {
		return backend.LockInfo{}, nil
	}
	kvs, err := d.holders(ctx, dir, resp.Kvs[0], resp.Header.Revision)
	if err != nil {
		return backend.LockInfo{}, err
	}
	if len(kvs) == 0 {
		return backend.LockInfo{Waiters: int(resp.Count)}, nil // not an entry of ours
	}
	hs := make([]backend.Holding, len(kvs))
	errs := make([]error, len(kvs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, kv := range kvs {
		permits, holder := parseValue(kv.Value)
		if permits < 0 {
			holder = "" // not a value of ours
		}
		hs[i] = backend.Holding{Token: backend.Token(kv.CreateRevision), Holder: holder}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ttl, err := call(ctx, d, "reading the holder's lease", func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
				return d.client.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			})
			switch {
			case err != nil:
				errs[i] = err
			case ttl.TTL > 0:
				hs[i].TTL = time.Duration(ttl.TTL) * time.Second
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return backend.LockInfo{}, err
	}
	h := hs[0]
	info := backend.LockInfo{Held: true, Token: h.Token, TTL: h.TTL, Holder: h.Holder, Waiters: int(resp.Count) - len(hs), Holders: hs}
	if isSharedKey(dir, string(resp.Kvs[0].Key)) {
		info.Shared = true
		info.Permits, _ = parseValue(resp.Kvs[0].Value)
	}
	return info, nil
}

// Keys implements backend.Inspector: the keys with a holder or a waiter
// under the Driver's prefix, read in pages of keys only.
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	end := clientv3.GetPrefixRangeEnd(d.prefix)
	from := d.prefix
	var keys []string
	for len(keys) < limit {
		resp, err := d.get(ctx, "listing the locks", from,
			clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)))
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 0 {
			break
		}
		for _, kv := range resp.Kvs {
			k := strings.TrimPrefix(string(kv.Key), d.prefix)
			i := strings.LastIndexByte(k, '/')
			if i < 0 {
				continue // not a queue entry
			}
			name := keyUnescaper.Replace(k[:i])
			if len(keys) == 0 || keys[len(keys)-1] != name {
				keys = append(keys, name)
			}
			// The next page starts after this key's directory.
			from = d.prefix + k[:i] + "0" // '0' follows '/'
			if len(keys) == limit {
				break
			}
		}
		if !resp.More {
			break
		}
	}
	return keys, nil
}

// keyUnescaper undoes escapeKey.
var keyUnescaper = strings.NewReplacer("%2F", "/", "%25", "%")
