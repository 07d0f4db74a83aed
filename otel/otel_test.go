package otel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memory"
	dlockotel "github.com/dlock-go/dlock/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// spyDriver is a memory driver that records the span in the context of
// each attempt.
type spyDriver struct {
	*memory.Driver
	mu    sync.Mutex
	spans []trace.SpanContext
}

func (d *spyDriver) TryAcquire(ctx context.Context, req backend.Request) (backend.Lease, error) {
	d.mu.Lock()
	d.spans = append(d.spans, trace.SpanContextFromContext(ctx))
	d.mu.Unlock()
	return d.Driver.TryAcquire(ctx, req)
}

// collect reads the metrics, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != dlockotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// attrs is the attribute set of kvs.
func attrs(kvs ...attribute.KeyValue) attribute.Set { return attribute.NewSet(kvs...) }

// sum returns the value of the int64 sum name at set (0, false if none).
func sum(t *testing.T, ms map[string]metricdata.Aggregation, name string, set attribute.Set) (int64, bool) {
	t.Helper()
	s, ok := ms[name].(metricdata.Sum[int64])
	if !ok {
		return 0, false
	}
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Value, true
		}
	}
	return 0, false
}

func TestObserver(t *testing.T) {
	ctx := t.Context()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := dlockotel.New(&dlockotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}

	store := memory.NewStore()
	d := &spyDriver{Driver: memory.NewDriver(store)}
	l, err := driver.New(d, &dlock.Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// a: acquired, then not acquired by a second try; refreshed; released
	// twice (the second finds it not held).
	a, err := l.TryAcquire(ctx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "a", nil); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v", err)
	}
	if err := a.Refresh(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// b: lost (the store drops it), then a refresh fails.
	b, err := l.TryAcquire(ctx, "b", nil)
	if err != nil {
		t.Fatal(err)
	}
	store.Expire("b")
	<-b.Done()
	if err := b.Refresh(ctx, 0); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a lost lease = %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release = %v", err)
	}
	// c: held until Close.
	c, err := l.TryAcquire(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}

	// Spans.
	ended := spans.Ended()
	var acquires, refreshes, releases []sdktrace.ReadOnlySpan
	for _, s := range ended {
		switch s.Name() {
		case "dlock.acquire":
			acquires = append(acquires, s)
		case "dlock.refresh":
			refreshes = append(refreshes, s)
		case "dlock.release":
			releases = append(releases, s)
		default:
			t.Errorf("unexpected span %q", s.Name())
		}
	}
	if len(acquires) != 4 || len(refreshes) != 2 || len(releases) != 2 {
		t.Fatalf("spans: %d acquire, %d refresh, %d release; want 4, 2, 2", len(acquires), len(refreshes), len(releases))
	}
	wantAcquire := []struct {
		key     string
		outcome string
		token   dlock.Token
	}{{"a", "acquired", a.Token()}, {"a", "not_acquired", 0}, {"b", "acquired", b.Token()}, {"c", "acquired", c.Token()}}
	for i, w := range wantAcquire {
		s := acquires[i]
		got := attribute.NewSet(s.Attributes()...)
		for _, kv := range []attribute.KeyValue{
			dlockotel.AttrBackend.String("memory"), dlockotel.AttrKey.String(w.key), dlockotel.AttrTry.Bool(true),
			dlockotel.AttrOutcome.String(w.outcome), dlockotel.AttrAttempts.Int(1),
		} {
			if v, ok := got.Value(kv.Key); !ok || v != kv.Value {
				t.Errorf("acquire span %d: %s = %v, want %v", i, kv.Key, v.Emit(), kv.Value.Emit())
			}
		}
		if v, ok := got.Value(dlockotel.AttrToken); w.token != 0 && (!ok || v.AsInt64() != int64(w.token)) {
			t.Errorf("acquire span %d: token %v, want %d", i, v.Emit(), w.token)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("acquire span %d has status Error", i)
		}
		// The attempt ran in the span: an instrumented client's calls
		// are its children.
		if !d.spans[i].Equal(s.SpanContext()) {
			t.Errorf("attempt %d ran in span %v, want the acquire span %v", i, d.spans[i].SpanID(), s.SpanContext().SpanID())
		}
	}
	if v, _ := spanAttr(refreshes[0], dlockotel.AttrOutcome); v.AsString() != "ok" || refreshes[0].Status().Code == codes.Error {
		t.Errorf("refresh of a: outcome %v, status %v", v.Emit(), refreshes[0].Status())
	}
	if v, _ := spanAttr(refreshes[1], dlockotel.AttrOutcome); v.AsString() != "not_held" || refreshes[1].Status().Code != codes.Error {
		t.Errorf("refresh of b: outcome %v, status %v", v.Emit(), refreshes[1].Status())
	}
	for i, want := range []string{"released", "not_held"} {
		if v, _ := spanAttr(releases[i], dlockotel.AttrOutcome); v.AsString() != want {
			t.Errorf("release %d: outcome %v, want %s", i, v.Emit(), want)
		}
	}

	// Metrics. The LeaseEnd events come on goroutines of their own: wait
	// for b's loss and a's release.
	mem := dlockotel.AttrBackend.String("memory")
	var ms map[string]metricdata.Aggregation
	for deadline := time.Now().Add(10 * time.Second); ; {
		ms = collect(t, reader)
		if n, _ := sum(t, ms, "dlock.leases.held", attrs(mem)); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dlock.leases.held never came to 1: %+v", ms["dlock.leases.held"])
		}
		time.Sleep(5 * time.Millisecond)
	}
	hist, ok := ms["dlock.acquire.duration"].(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("dlock.acquire.duration = %T", ms["dlock.acquire.duration"])
	}
	counts := map[string]uint64{}
	for _, dp := range hist.DataPoints {
		if _, ok := dp.Attributes.Value(dlockotel.AttrKey); ok {
			t.Errorf("dlock.acquire.duration has the key as an attribute: %v", dp.Attributes)
		}
		if v, _ := dp.Attributes.Value(dlockotel.AttrBackend); v.AsString() != "memory" {
			t.Errorf("dlock.acquire.duration backend %v", v.Emit())
		}
		v, _ := dp.Attributes.Value(dlockotel.AttrOutcome)
		counts[v.AsString()] += dp.Count
	}
	if counts["acquired"] != 3 || counts["not_acquired"] != 1 || len(counts) != 2 {
		t.Errorf("dlock.acquire.duration counts by outcome = %v, want acquired 3, not_acquired 1", counts)
	}
	att, ok := ms["dlock.acquire.attempts"].(metricdata.Histogram[int64])
	if !ok {
		t.Fatalf("dlock.acquire.attempts = %T", ms["dlock.acquire.attempts"])
	}
	var attempts int64
	for _, dp := range att.DataPoints {
		attempts += dp.Sum
	}
	if attempts != 4 {
		t.Errorf("dlock.acquire.attempts sum = %d, want 4", attempts)
	}
	for _, c := range []struct {
		name string
		set  attribute.Set
		want int64
	}{
		{"dlock.refresh.failures", attrs(mem, dlockotel.AttrOutcome.String("not_held"), dlockotel.AttrAuto.Bool(false)), 1},
		{"dlock.releases", attrs(mem, dlockotel.AttrOutcome.String("released")), 1},
		{"dlock.releases", attrs(mem, dlockotel.AttrOutcome.String("not_held")), 1},
		{"dlock.lease.losses", attrs(mem, dlockotel.AttrReason.String("backend")), 1},
		{"dlock.leases.held", attrs(mem), 1},
	} {
		if n, ok := sum(t, ms, c.name, c.set); !ok || n != c.want {
			t.Errorf("%s{%v} = %d (found %v), want %d", c.name, c.set.Encoded(attribute.DefaultEncoder()), n, ok, c.want)
		}
	}
	for _, name := range []string{"dlock.refresh.failures", "dlock.releases", "dlock.lease.losses", "dlock.leases.held"} {
		if s, ok := ms[name].(metricdata.Sum[int64]); !ok || len(s.DataPoints) != 1+boolInt(name == "dlock.releases") {
			t.Errorf("%s = %+v", name, ms[name])
		}
	}

	// Close ends c: no lease held.
	l.Close()
	if n, _ := sum(t, collect(t, reader), "dlock.leases.held", attrs(mem)); n != 0 {
		t.Errorf("dlock.leases.held after Close = %d", n)
	}
	if n, _ := sum(t, collect(t, reader), "dlock.lease.losses", attrs(mem, dlockotel.AttrReason.String("backend"))); n != 1 {
		t.Errorf("dlock.lease.losses after Close = %d (Close is no loss)", n)
	}
}

// spanAttr returns the value of the attribute k of s.
func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	set := attribute.NewSet(s.Attributes()...)
	return set.Value(k)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// An acquire that fails is an Error span; a cancelled wait is not.
func TestAcquireErrorSpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	obs, err := dlockotel.New(&dlockotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := memory.New(memory.NewStore(), &dlock.Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.TryAcquire(t.Context(), "", nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatal(err)
	}
	held, err := l.TryAcquire(t.Context(), "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx, "k", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	if s := ended[0]; s.Status().Code != codes.Error || len(s.Events()) != 1 || s.Events()[0].Name != "exception" {
		t.Errorf("span of a bad key: status %v, events %v; want Error with the error recorded", s.Status(), s.Events())
	}
	out, _ := spanAttr(ended[2], dlockotel.AttrOutcome)
	try, _ := spanAttr(ended[2], dlockotel.AttrTry)
	if s := ended[2]; s.Status().Code == codes.Error || out.AsString() != "cancelled" || try.AsBool() {
		t.Errorf("span of a cancelled Acquire: status %v, outcome %v, try %v", s.Status(), out.Emit(), try.Emit())
	}
}
