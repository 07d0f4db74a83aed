package etcd

import (
	"context"
	"strings"
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
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	resp, err := d.get(ctx, "reading the queue", d.dir(key),
		clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return backend.LockInfo{}, err
	}
	if len(resp.Kvs) == 0 {
		return backend.LockInfo{}, nil
	}
	holder := resp.Kvs[0]
	info := backend.LockInfo{Held: true, Token: backend.Token(holder.CreateRevision), Holder: string(holder.Value), Waiters: int(resp.Count) - 1}
	ttl, err := call(ctx, d, "reading the holder's lease", func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return d.client.TimeToLive(ctx, clientv3.LeaseID(holder.Lease))
	})
	if err != nil {
		return backend.LockInfo{}, err
	}
	if ttl.TTL > 0 {
		info.TTL = time.Duration(ttl.TTL) * time.Second
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
