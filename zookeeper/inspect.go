package zookeeper

import (
	"context"
	"errors"
	"net/url"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Inspector = (*Driver)(nil)

// Inspect implements backend.Inspector. It lists key's queue (the children
// of its container node): the nodes the grant rule grants (the node with
// the lowest sequence number, or the shared nodes at the head of the
// queue, see "Shared leases" in the package doc) are the holders, oldest
// first, each with its node's czxid as token, and the others are the
// waiters (a TryAcquire that found the lock held counts for the moment its
// node exists). Shared and Permits come from the head node's name. TTL is
// 0 (unknown): a lock node lives as long as its holder's session, and the
// lease's TTL is kept by the holder's own process. Holder is the holder
// node's data, which the acquire's create wrote (see holderData). It
// writes nothing: a listing of names and a Stat of each holder's node (in
// parallel), then, only for a node that has data of at most
// backend.MaxHolderLen bytes, one read of it. Longer data, or data that is
// not a valid description (backend.ValidateHolder: planted by a client
// allowed to write the node, or by another program's lock recipe), is
// never shown: Holder is "" then, so planted data cannot reach a
// terminal, and costs Inspect at most MaxHolderLen bytes per holder unless
// the node is rewritten between the Stat and the read (then at most
// ZooKeeper's jute.maxbuffer, about 1 MB, once).
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
		q := entries(kids)
		n := holders(q)
		if n == 0 {
			return backend.LockInfo{}, nil
		}
		hs, gone, err := d.holdings(ctx, parent, q[:n])
		if err != nil {
			return backend.LockInfo{}, err
		}
		if gone {
			continue // released since the listing: list again
		}
		h := hs[0]
		return backend.LockInfo{Held: true, Token: h.Token, Holder: h.Holder, Waiters: len(q) - n,
			Shared: q[0].kind.shared, Permits: q[0].kind.permits, Holders: hs}, nil
	}
}

// inspectConcurrency bounds the reads of Inspect's holders in flight.
const inspectConcurrency = 32

// holdings reads the token (czxid) and holder description of each holder
// node in hs, in parallel; gone reports that one was deleted since the
// listing.
func (d *Driver) holdings(ctx context.Context, parent string, hs []queued) (out []backend.Holding, gone bool, err error) {
	out = make([]backend.Holding, len(hs))
	errs := make([]error, len(hs))
	vanished := make([]bool, len(hs))
	one := func(i int) {
		node := parent + "/" + hs[i].name
		var stat *zk.Stat
		errs[i] = d.read(ctx, false, func() (err error) {
			_, stat, err = d.conn.Exists(node)
			return err
		})
		switch {
		case errs[i] != nil:
			errs[i] = unavailable("reading the holder's node", errs[i])
			return
		case stat == nil || stat.Czxid == 0:
			vanished[i] = true
			return
		}
		out[i].Token = backend.Token(stat.Czxid)
		out[i].Holder, vanished[i], errs[i] = d.holder(ctx, node, stat)
	}
	if len(hs) == 1 {
		one(0)
	} else {
		next := make(chan int, len(hs))
		for i := range hs {
			next <- i
		}
		close(next)
		var wg sync.WaitGroup
		closed := false
		for range min(len(hs), inspectConcurrency) {
			wg.Add(1)
			if !d.bg.Go(func() {
				defer wg.Done()
				for i := range next {
					one(i)
				}
			}) {
				wg.Done()
				closed = true
				break
			}
		}
		wg.Wait()
		if closed {
			return nil, false, backend.ErrClosed
		}
	}
	for i := range hs {
		if errs[i] != nil {
			return nil, false, errs[i]
		}
		gone = gone || vanished[i]
	}
	return out, gone, nil
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
