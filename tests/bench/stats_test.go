package bench

// Shared measuring helpers of the peer and scale benchmarks: worker pools,
// latency quantiles, client CPU and RSS, and the servers' own counters.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/tests/servers"
)

// runCycles runs b.N calls of the workers' cycle functions, shared among w
// goroutines (each its own function, made by mk before the timer starts),
// and reports cycles/s and the client CPU per cycle (cli-µs/op, from
// getrusage, the whole process).
func runCycles(b *testing.B, w int, mk func(i int) func() error) {
	runCyclesAs(b, w, "cycles/s", mk)
}

// rateEnv, set to N > 0, paces runCycles and runCyclesAs
// (BenchmarkCycle, BenchmarkSemaphore): the cycles together start at
// most N per second (cycle k not before k/N s after the first), so that two
// libraries can be compared at the same rate, below both their ceilings:
// their CPU per cycle then does not depend on how fast each one goes.
// Unset, the workers go as fast as they can. A paced run's cycles/s is N
// if the library keeps up.
const rateEnv = "DLOCK_BENCH_RATE"

// paceEvery is the interval between cycle starts under rateEnv (0: none).
var paceEvery = func() time.Duration {
	n, err := strconv.ParseFloat(os.Getenv(rateEnv), 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / n)
}()

// runCyclesAs is runCycles reporting the rate in unit (such as
// "permits/s") instead of cycles/s.
func runCyclesAs(b *testing.B, w int, unit string, mk func(i int) func() error) {
	fns := make([]func() error, w)
	for i := range fns {
		fns[i] = mk(i)
	}
	var remaining atomic.Int64
	remaining.Store(int64(b.N))
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Go(func() {
			for {
				k := int64(b.N) - remaining.Add(-1) - 1 // this cycle's number, from 0
				if k >= int64(b.N) {
					return
				}
				if paceEvery > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(k) * paceEvery)))
				}
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), unit)
	b.ReportMetric(float64(cpuTime()-cpu0)/1e3/float64(b.N), "cli-µs/op")
}

// runHandoff runs b.N lock cycles with hold 0 among len(locks) goroutines
// contending for one key, each with its own LockFunc (its own client, as
// separate processes would have). It reports cycles/s (every cycle, also
// a worker taking the lock again right after its own release);
// handoffs/s, the cycles whose acquire followed another worker's release;
// p50-ms and p99-ms of the handoff wait (from a holder's release returning
// to the next acquire returning in another goroutine: what a queued
// process waits beyond the holder's critical section); and spread, the
// most acquisitions any one goroutine had divided by the fewest (+Inf when
// one had none), reported when b.N gives each goroutine 10 turns on
// average.
func runHandoff(b *testing.B, locks []lockFunc) {
	var (
		remaining atomic.Int64
		lastAt    atomic.Int64 // nanotime of the last release; -1 once taken
		lastBy    atomic.Int64
		mu        sync.Mutex
		waits     []time.Duration
		counts    = make([]int64, len(locks))
	)
	remaining.Store(int64(b.N))
	lastAt.Store(-1)
	origin := time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, lock := range locks {
		wg.Go(func() {
			ctx := context.Background()
			for remaining.Add(-1) >= 0 {
				unlock, err := lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				counts[i]++
				if at := lastAt.Swap(-1); at >= 0 && lastBy.Load() != int64(i) {
					w := time.Since(origin) - time.Duration(at)
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
				}
				lastBy.Store(int64(i))
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				lastAt.Store(int64(time.Since(origin)))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(origin)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(float64(len(waits))/elapsed.Seconds(), "handoffs/s")
	if len(waits) > 0 {
		slices.Sort(waits)
		b.ReportMetric(ms(quantile(waits, 0.50)), "p50-ms")
		b.ReportMetric(ms(quantile(waits, 0.99)), "p99-ms")
	}
	if b.N >= 10*len(locks) {
		lo, hi := slices.Min(counts), slices.Max(counts)
		b.ReportMetric(float64(hi)/float64(lo), "spread") // +Inf if lo == 0
	}
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// cpuTime returns the user + system CPU time this process has used, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// rssMB returns this process's resident set size (VmRSS) in MiB, 0 if
// /proc cannot tell.
func rssMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// settledGoroutines waits (up to 5s) for the goroutine count to come down
// to at most want, and returns the count then.
func settledGoroutines(want int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serverStats are a backend's servers' own counters, summed over its
// servers. What counts as an op differs per backend (see the counters);
// compare a backend with itself (before/after, or peers on it), not
// backends with each other.
type serverStats struct {
	ops    float64 // requests the servers processed
	writes float64 // replicated writes (etcd proposals, ZooKeeper zxids); -1 if not known
	conns  float64 // client connections now; -1 if not known
	// cpu is the servers' CPU time in µs: on Redis the main thread's
	// (INFO cpu used_cpu_sys_main_thread + used_cpu_user_main_thread,
	// which covers reading, running and answering every command), on
	// etcd and ZooKeeper every process of the servers' containers
	// (Server.CPU: the Docker engine's account, all threads, the JVM's
	// too); -1 if not known.
	cpu float64
}

// sub returns s - o for the counters (conns stays s's).
func (s serverStats) sub(o serverStats) serverStats {
	d := serverStats{ops: s.ops - o.ops, writes: -1, conns: s.conns, cpu: -1}
	if s.writes >= 0 && o.writes >= 0 {
		d.writes = s.writes - o.writes
	}
	if s.cpu >= 0 && o.cpu >= 0 {
		d.cpu = s.cpu - o.cpu
	}
	return d
}

// report reports the counters d (after.sub(before)) per unit of n (such
// as "op" or "permit"): srv-ops, and srv-writes and srv-cpu-µs where the
// backend tells.
func (d serverStats) report(b *testing.B, n int, unit string) {
	b.ReportMetric(d.ops/float64(n), "srv-ops/"+unit)
	if d.writes >= 0 {
		b.ReportMetric(d.writes/float64(n), "srv-writes/"+unit)
	}
	if d.cpu >= 0 {
		b.ReportMetric(d.cpu/float64(n), "srv-cpu-µs/"+unit)
	}
}

// redisStats reads INFO stats total_commands_processed (which counts the
// INFO calls too, and a script's inner calls), INFO clients
// connected_clients and INFO cpu's main-thread CPU time of every address.
func redisStats(tb testing.TB, addrs ...string) func(context.Context) (serverStats, error) {
	cs := make([]*goredis.Client, len(addrs))
	for i, a := range addrs {
		cs[i] = goredis.NewClient(&goredis.Options{Addr: a, PoolSize: 1})
		tb.Cleanup(func() { _ = cs[i].Close() })
	}
	return func(ctx context.Context) (serverStats, error) {
		s := serverStats{writes: -1}
		for _, c := range cs {
			info, err := c.Info(ctx, "stats", "clients", "cpu").Result()
			if err != nil {
				return s, err
			}
			f := infoFields(info)
			s.ops += f["total_commands_processed"]
			s.conns += f["connected_clients"] - 1 // not this reader's own
			s.cpu += (f["used_cpu_sys_main_thread"] + f["used_cpu_user_main_thread"]) * 1e6
		}
		return s, nil
	}
}

// infoFields parses the numeric "name:value" lines of INFO or mntr output
// (either separator: ':' or tab).
func infoFields(text string) map[string]float64 {
	m := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			name, v, ok = strings.Cut(line, "\t")
		}
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			m[name] = f
		}
	}
	return m
}

// addCPU returns cpu (µs; -1 if not known) plus m's container's CPU
// time, or -1 if either is not known (an engine that reports none).
func addCPU(ctx context.Context, cpu float64, m *servers.Server) float64 {
	t, err := m.CPU(ctx)
	if err != nil || cpu < 0 {
		return -1
	}
	return cpu + float64(t.Microseconds())
}

// etcdStats reads each member's /metrics: ops are gRPC messages received
// (grpc_server_msg_received_total, every method and stream message, so a
// keepalive on a stream counts once per message), writes are Raft
// proposals committed (etcd_server_proposals_committed_total); cpu is the
// members' containers' (Server.CPU).
func etcdStats(members ...*servers.Server) func(context.Context) (serverStats, error) {
	return func(ctx context.Context) (serverStats, error) {
		s := serverStats{conns: -1}
		for _, m := range members {
			ep := m.Addr()
			s.cpu = addCPU(ctx, s.cpu, m)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+"/metrics", nil)
			if err != nil {
				return s, err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return s, err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return s, err
			}
			var found [2]bool
			for line := range strings.Lines(string(body)) {
				name, v, ok := strings.Cut(strings.TrimSpace(line), " ")
				if !ok || strings.HasPrefix(name, "#") {
					continue
				}
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					continue
				}
				switch {
				case strings.HasPrefix(name, "grpc_server_msg_received_total{"):
					s.ops += f
					found[0] = true
				case name == "etcd_server_proposals_committed_total":
					s.writes += f
					found[1] = true
				}
			}
			if !found[0] || !found[1] {
				return s, fmt.Errorf("etcd %s /metrics: no grpc_server_msg_received_total or etcd_server_proposals_committed_total", ep)
			}
		}
		return s, nil
	}
}

// zkStats takes the servers' containers' cpu (Server.CPU) and asks each
// server the four-letter words mntr (ops:
// zk_packets_received; conns: zk_num_alive_connections, less this
// reader's) and srvr (writes: the zxid's counter, which every write
// transaction bumps; it restarts at a new epoch, which no benchmark here
// causes).
func zkStats(members ...*servers.Server) func(context.Context) (serverStats, error) {
	return func(ctx context.Context) (serverStats, error) {
		var s serverStats
		for _, m := range members {
			a := m.Addr()
			s.cpu = addCPU(ctx, s.cpu, m)
			mntr, err := fourLetter(ctx, a, "mntr")
			if err != nil {
				return s, err
			}
			f := infoFields(mntr)
			s.ops += f["zk_packets_received"]
			s.conns += f["zk_num_alive_connections"] - 1
			srvr, err := fourLetter(ctx, a, "srvr")
			if err != nil {
				return s, err
			}
			for line := range strings.Lines(srvr) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Zxid: 0x"); ok {
					z, err := strconv.ParseUint(v, 16, 64)
					if err != nil {
						return s, fmt.Errorf("zookeeper %s srvr: %q: %w", a, line, err)
					}
					s.writes += float64(z & 0xffffffff)
				}
			}
		}
		return s, nil
	}
}

// fourLetter sends a ZooKeeper four-letter word to addr and returns the
// answer.
func fourLetter(ctx context.Context, addr, word string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(word)); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("zookeeper %s %s: %w", addr, word, err)
	}
	return string(out), nil
}
