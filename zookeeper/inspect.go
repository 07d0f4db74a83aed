package zookeeper

import (
	"context"
	"errors"
	"net/url"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Inspector = (*Driver)(nil)

// Inspect implements backend.Inspector. It lists key's queue (the children
// of its container node): the node with the lowest sequence number is the
// holder, its czxid the token, and the others are the waiters (a
// TryAcquire that found the lock held counts for the moment its node
// exists). TTL is 0 (unknown): a lock node lives as long as its holder's
// session, and the lease's TTL is kept by the holder's own process. Holder
// is the holder node's data, which the acquire's create wrote (see
// holderData). It writes nothing: a listing of names and a Stat of the
// holder's node, then, only when that node has data of at most
// backend.MaxHolderLen bytes, one read of it. Longer data, or data that is
// not a valid description (backend.ValidateHolder: planted by a client
// allowed to write the node, or by another program's lock recipe), is
// never shown: Holder is "" then, so planted data cannot reach a
// terminal, and costs Inspect at most MaxHolderLen bytes unless the node
// is rewritten between the Stat and the read (then at most ZooKeeper's
// jute.maxbuffer, about 1 MB, once).
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	parent := d.parent(key)
	for {
		var kids []string
		err := d.read(ctx, false, func() (err error) {
			kids, _, err = d.conn.Children(parent)
			return err
		})
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return backend.LockInfo{}, nil
		case err != nil:
			return backend.LockInfo{}, unavailable("listing the queue", err)
		}
		var (
			first    string
			firstSeq int32
		)
		for _, k := range kids {
			if s, ok := seq(k); ok && (first == "" || before(s, firstSeq)) {
				first, firstSeq = k, s
			}
		}
		if first == "" {
			return backend.LockInfo{}, nil
		}
		var stat *zk.Stat
		err = d.read(ctx, false, func() (err error) {
			_, stat, err = d.conn.Exists(parent + "/" + first)
			return err
		})
		if err != nil {
			return backend.LockInfo{}, unavailable("reading the holder's node", err)
		}
		if stat == nil || stat.Czxid == 0 {
			continue // released since the listing: list again
		}
		holder, gone, err := d.holder(ctx, parent+"/"+first, stat)
		if err != nil {
			return backend.LockInfo{}, err
		}
		if gone {
			continue
		}
		return backend.LockInfo{Held: true, Token: backend.Token(stat.Czxid), Holder: holder, Waiters: len(kids) - 1}, nil
	}
}

// holder reads the holder description of node, the queue's head, whose
// Stat is stat: "" without a read when the node has no data or more than
// backend.MaxHolderLen bytes (see Inspect). gone reports that the node was
// deleted since (released: Inspect lists the queue again).
func (d *Driver) holder(ctx context.Context, node string, stat *zk.Stat) (holder string, gone bool, err error) {
	if stat.DataLength <= 0 || stat.DataLength > backend.MaxHolderLen {
		return "", false, nil
	}
	var (
		data []byte
		now  *zk.Stat
	)
	err = d.read(ctx, false, func() (err error) {
		data, now, err = d.conn.Get(node)
		return err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return "", true, nil
	case err != nil:
		return "", false, unavailable("reading the holder's node", err)
	case now.Czxid != stat.Czxid:
		return "", true, nil // another node of that name (cannot happen: names carry a GUID)
	case backend.ValidateHolder(string(data)) != nil:
		return "", false, nil // longer since the Stat, or not a description
	}
	return string(data), false, nil
}

// Keys implements backend.Inspector: the keys whose container node under
// the prefix has lock nodes (a container stays for a while after its last
// lock node is gone). One request per container until limit keys are
// found.
func (d *Driver) Keys(ctx context.Context, limit int) ([]string, error) {
	var parents []string
	err := d.read(ctx, false, func() (err error) {
		parents, _, err = d.conn.Children(d.prefix)
		return err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil, nil
	case err != nil:
		return nil, unavailable("listing the locks", err)
	}
	var keys []string
	for _, p := range parents {
		if len(keys) == limit {
			break
		}
		if p == sentinel {
			continue
		}
		key, err := url.PathUnescape(p)
		if err != nil {
			continue // not one of ours
		}
		var stat *zk.Stat
		err = d.read(ctx, false, func() (err error) {
			_, stat, err = d.conn.Exists(d.prefix + "/" + p)
			return err
		})
		if err != nil {
			return nil, unavailable("reading "+p, err)
		}
		if stat != nil && stat.NumChildren > 0 {
			keys = append(keys, key)
		}
	}
	return keys, nil
}
