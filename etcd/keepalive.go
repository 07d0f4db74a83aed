package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// keeper sends the keepalives of a Driver's leases on a few LeaseKeepAlive
// streams (a keepalive is not a Raft write; the leader renews the lease in
// memory), each call's requests all on one stream (and its re-sent ones on
// another), the calls taking the streams in turn. The server answers the
// requests of one stream in order, one answer per request, so answers are
// matched to requests by lease ID, first in first out. A stream that
// fails, or that has answered nothing for kaStuck while a request on it
// waits (a frozen member), is dropped: its unanswered requests fail, or
// are sent again by their callers while the request timeout lasts (see
// start), and the next request on its slot opens a new stream, which the
// client may send to another member.
type keeper struct {
	d *Driver

	mu   sync.Mutex
	cur  [kaStreams]*kaStream
	next int // the slot of the next stream to use
}

// kaStreams is how many keepalive streams a Driver keeps: the server
// answers the requests of one stream one at a time, so a few streams let it
// renew the leases of concurrent batches and acquires in parallel.
const kaStreams = 4

// kaStuck is how long a stream may go without an answer, while a request
// on it is unanswered, before it is dropped (its member may be frozen). A
// stream that answers, only slowly, is kept.
const kaStuck = time.Second

// kaStream is one LeaseKeepAlive stream and its unanswered requests.
type kaStream struct {
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc

	sendMu sync.Mutex // serializes Send

	mu         sync.Mutex
	pending    map[int64][]chan kaAnswer
	err        error     // set when the stream has ended
	quietSince time.Time // when the stream was opened, last answered, or took a request while none waited
}

// kaAnswer is the server's answer to one keepalive: the lease's TTL in
// seconds (<= 0: the lease is gone), or an error.
type kaAnswer struct {
	ttl int64
	err error
}

// renewal is the outcome of one keepalive.
type renewal struct {
	ttl  time.Duration // granted; 0 with err == nil never happens
	sent time.Time     // when the request was sent: the lease lasts ttl from then at least
	err  error         // wraps ErrNotHeld (the lease is gone) or ErrUnavailable
}

// stream returns the current stream, opening one if there is none. The
// open is bounded by ctx.
func (k *keeper) stream(ctx context.Context) (*kaStream, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	slot := k.next
	k.next = (k.next + 1) % kaStreams
	if k.cur[slot] != nil {
		return k.cur[slot], nil
	}
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(k.d.ctx))
	stop := context.AfterFunc(ctx, cancel)
	st, err := clientv3.RetryLeaseClient(k.d.client).LeaseKeepAlive(sctx)
	if !stop() {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		cancel()
		return nil, unavailable("opening a keepalive stream", clientv3.ContextError(ctx, err))
	}
	s := &kaStream{stream: st, cancel: cancel, pending: map[int64][]chan kaAnswer{}, quietSince: time.Now()}
	if !k.d.bg.Go(func() { k.recv(s) }) {
		cancel()
		return nil, fmt.Errorf("%w: etcd: the driver is closed", backend.ErrClosed)
	}
	k.cur[slot] = s
	return s, nil
}

// recv delivers the answers of s until it ends.
func (k *keeper) recv(s *kaStream) {
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			k.drop(s, err)
			return
		}
		s.mu.Lock()
		s.quietSince = time.Now()
		q := s.pending[resp.ID]
		var ch chan kaAnswer
		if len(q) > 0 {
			ch = q[0]
			if len(q) == 1 {
				delete(s.pending, resp.ID)
			} else {
				s.pending[resp.ID] = q[1:]
			}
		}
		s.mu.Unlock()
		if ch != nil {
			ch <- kaAnswer{ttl: resp.TTL}
		}
	}
}

// drop ends s with err: its unanswered requests fail, and the next request
// opens a new stream. The first drop's err is the one every unanswered
// request gets: it is recorded before the stream is cancelled, whose
// receive loop then drops s again with the cancellation.
func (k *keeper) drop(s *kaStream, err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	err = s.err
	pending := s.pending
	s.pending = map[int64][]chan kaAnswer{}
	s.mu.Unlock()
	k.mu.Lock()
	for i := range k.cur {
		if k.cur[i] == s {
			k.cur[i] = nil
		}
	}
	k.mu.Unlock()
	s.cancel()
	for _, q := range pending {
		for _, ch := range q {
			ch <- kaAnswer{err: err}
		}
	}
}

// stuck reports whether s has been quiet for kaStuck: no answer, and no
// request taken while none waited, in that time.
func (s *kaStream) stuck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.quietSince) >= kaStuck
}

// errStreamStuck is why a stream whose answer did not come in time is
// dropped.
var errStreamStuck = errors.New("a keepalive went unanswered")

// send sends one keepalive per id, in order, and returns the channels their
// answers come on (each receives exactly one answer) and when each was
// sent.
func (k *keeper) send(ctx context.Context, ids []clientv3.LeaseID) (*kaStream, []chan kaAnswer, []time.Time, error) {
	s, err := k.stream(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	chs := make([]chan kaAnswer, len(ids))
	sent := make([]time.Time, len(ids))
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	for i, id := range ids {
		ch := make(chan kaAnswer, 1)
		chs[i] = ch
		s.mu.Lock()
		if s.err != nil {
			s.mu.Unlock()
			ch <- kaAnswer{err: s.err}
			continue
		}
		if len(s.pending) == 0 {
			s.quietSince = time.Now() // an idle stream is not stuck
		}
		s.pending[int64(id)] = append(s.pending[int64(id)], ch)
		s.mu.Unlock()
		sent[i] = time.Now()
		if err := s.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
			// The stream has ended: drop fails every pending request,
			// this one included.
			k.drop(s, err)
		}
	}
	return s, chs, sent, nil
}

// renew sends one keepalive for each of ids on the shared stream and waits
// for the answers: start(ctx, ids)().
func (k *keeper) renew(ctx context.Context, ids []clientv3.LeaseID) []renewal {
	return k.start(ctx, ids)()
}

// start sends one keepalive for each of ids on the shared stream now, and
// returns a function that waits for the answers, or until ctx ends or the
// request timeout has passed since the sending: the unanswered ones then
// fail with ErrUnavailable, and a stream that left a request unanswered
// until a deadline while it has answered nothing for kaStuck is dropped
// (the member may be frozen). Such a stream is also dropped while the
// request timeout lasts, and the unanswered keepalives are sent again on
// another stream, which the client may send to another member: a
// keepalive is safe to send twice, and each renewal counts from the
// sending of the request that was answered. A stream that answers, only
// slowly, is waited for.
func (k *keeper) start(ctx context.Context, ids []clientv3.LeaseID) func() []renewal {
	out := make([]renewal, len(ids))
	rctx, cancel := context.WithTimeout(ctx, k.d.timeout)
	s, chs, sent, err := k.send(rctx, ids)
	if err != nil {
		cancel()
		for i := range out {
			out[i].err = err
		}
		return func() []renewal { return out }
	}
	// await waits for ch, on s, and returns the answer (errStreamStuck if
	// s went quiet for kaStuck meanwhile: it drops s, and the caller sends
	// again while rctx lasts). If rctx ends first, it sets out[i] as failed
	// and returns false (an answer already in counts still).
	await := func(i int, s *kaStream, ch chan kaAnswer) (kaAnswer, bool) {
		select {
		case a := <-ch:
			return a, true
		default:
		}
		tick := time.NewTicker(kaStuck)
		defer tick.Stop()
		for {
			select {
			case a := <-ch:
				return a, true
			case <-tick.C:
				if s.stuck() {
					k.drop(s, errStreamStuck) // ch receives errStreamStuck
				}
				continue
			case <-rctx.Done():
			}
			switch {
			case ctx.Err() == nil:
				if s.stuck() {
					k.drop(s, errStreamStuck)
				}
				out[i].err = fmt.Errorf("%w: etcd: renewing the lease: no answer within the request timeout (%v)", backend.ErrUnavailable, k.d.timeout)
			default:
				if ctxDeadline(ctx) && s.stuck() {
					k.drop(s, errStreamStuck)
				}
				out[i].err = unavailable("renewing the lease", ctx.Err())
			}
			return kaAnswer{}, false
		}
	}
	return func() []renewal {
		defer cancel()
		todo := make([]int, len(ids))
		for i := range todo {
			todo[i] = i
		}
		for {
			var again []int
			for _, i := range todo {
				out[i].sent = sent[i]
				a, ok := await(i, s, chs[i])
				switch {
				case !ok:
				case errors.Is(a.err, errStreamStuck) && rctx.Err() == nil:
					again = append(again, i) // dropped by this call, or another
				case a.err != nil:
					out[i].err = unavailable("renewing the lease", a.err)
				case a.ttl <= 0:
					out[i].err = fmt.Errorf("%w: etcd: the lease has expired", backend.ErrNotHeld)
				default:
					out[i].ttl = time.Duration(a.ttl) * time.Second
				}
			}
			if len(again) == 0 {
				return out
			}
			retry := make([]clientv3.LeaseID, len(again))
			for j, i := range again {
				retry[j] = ids[i]
			}
			s2, chs2, sent2, err := k.send(rctx, retry)
			if err != nil {
				for _, i := range again {
					out[i].err = err
				}
				return out
			}
			for j, i := range again {
				chs[i], sent[i] = chs2[j], sent2[j]
			}
			s, todo = s2, again
		}
	}
}

// renewOne is renew of one lease.
func (k *keeper) renewOne(ctx context.Context, id clientv3.LeaseID) renewal {
	return k.renew(ctx, []clientv3.LeaseID{id})[0]
}

// ctxDeadline reports whether ctx ended by its deadline.
func ctxDeadline(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded)
}
