package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/fencecheck"
)

// FenceTokenSuffix follows a data key to name the key where [FenceStore] keeps the
// highest token written to it. Token keys share the data's prefix, so a
// prefix read or watch of the data sees them too.
const FenceTokenSuffix = "\x00fence-token"

// FenceStore fences writes to etcd keys: one transaction compares the token kept
// beside the data and writes both. To fence an etcd write with no extra
// state, use the lock's ownership in the write's own transaction instead
// (etcd.OwnerOf(lease).Cmp()), which fails once the lock is lost.
type FenceStore struct {
	Client *clientv3.Client
}

// Set stores value under key if token is at least the highest token a
// write to key has carried (equal tokens pass), and records token, in one
// transaction; see [fence.Store] for the errors.
func (e FenceStore) Set(ctx context.Context, key, value string, token dlock.Token) error {
	if err := fencecheck.Set("etcd", key, uint64(token), e.Client == nil); err != nil {
		return err
	}
	tk, tok := key+FenceTokenSuffix, fencecheck.Padded(uint64(token))
	write := []clientv3.Op{clientv3.OpPut(key, value), clientv3.OpPut(tk, tok)}
	// A Value compare fails on a missing key, hence the first branch.
	resp, err := e.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(tk), "=", 0)).
		Then(write...).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(tk), ">", tok)}, // stale
			[]clientv3.Op{clientv3.OpGet(tk)},
			write,
		)).Commit()
	if err != nil {
		return fmt.Errorf("%w: fence: etcd: %w", backend.ErrUnavailable, err)
	}
	if resp.Succeeded {
		return nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if !inner.Succeeded {
		return nil // not stale: written
	}
	var highest dlock.Token
	if kvs := inner.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		highest = dlock.Token(fencecheck.Unpad(string(kvs[0].Value)))
	}
	return &fence.StaleError{Resource: key, Token: token, Highest: highest}
}
