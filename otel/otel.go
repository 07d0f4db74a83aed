// Package otel reports dlock's acquires, refreshes, releases and lease
// ends to OpenTelemetry, as traces and metrics. It is a module of its own
// (github.com/dlock-go/dlock/otel), so that programs that do not use
// OpenTelemetry do not depend on it.
//
//	obs, err := dlockotel.New(nil) // the global TracerProvider and MeterProvider
//	if err != nil { ... }
//	locker, err := redis.New(ctx, client, &redis.Options{Locker: dlock.Options{Observer: obs}})
//
// # Traces
//
// Each Acquire and TryAcquire is a span named "dlock.acquire", started
// before the attempts: the backend's calls made in it (by an instrumented
// client) are its children. Its attributes: dlock.backend, dlock.key,
// dlock.try, and at its end dlock.outcome, dlock.attempts and dlock.token;
// its status is Error when the outcome is "error" (not for a lock held
// elsewhere or a cancelled wait). Each call of Lease.Refresh is a span
// "dlock.refresh" and each call of Lease.Release a span "dlock.release",
// children of the caller's context. Background refreshes
// (AcquireOptions.AutoRefresh) and lease ends have no span (they have no
// caller's context; a root span per refresh would be noise): they are in
// the metrics.
//
// # Metrics
//
// The attributes of the metrics are of low cardinality: the backend, the
// outcome or reason, never the key.
//
//   - dlock.acquire.duration (histogram, s): the time an acquire took,
//     waiting included; dlock.backend, dlock.outcome ("acquired",
//     "not_acquired", "cancelled", "error"), dlock.try.
//   - dlock.acquire.attempts (histogram, {attempt}): the attempts an
//     acquire made on the backend; same attributes.
//   - dlock.refresh.failures (counter, {refresh}): refreshes that failed;
//     dlock.backend, dlock.outcome ("not_held": the lease is lost; "error":
//     the outcome is unknown), dlock.refresh.auto.
//   - dlock.releases (counter, {release}): calls of Lease.Release;
//     dlock.backend, dlock.outcome ("released", "not_held", "error").
//   - dlock.lease.losses (counter, {lease}): leases lost; dlock.backend,
//     dlock.reason ("expired", "not_held", "backend", "release_failed":
//     see observe.EndReason).
//   - dlock.leases.held (up-down counter, {lease}): leases held now, by
//     dlock.backend.
package otel

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/observe"
	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/dlock-go/dlock/otel"

// The attribute keys of the spans and metrics.
const (
	// AttrBackend: the backend's name ("redis", "etcd", ...; see
	// backend.Guarantees.Backend). On spans and metrics.
	AttrBackend = attribute.Key("dlock.backend")
	// AttrOutcome: how an acquire, refresh or release ended. On spans and
	// metrics.
	AttrOutcome = attribute.Key("dlock.outcome")
	// AttrReason: why a lease was lost (observe.EndReason). On metrics.
	AttrReason = attribute.Key("dlock.reason")
	// AttrTry: true for TryAcquire, false for Acquire.
	AttrTry = attribute.Key("dlock.try")
	// AttrAuto: true for a background refresh.
	AttrAuto = attribute.Key("dlock.refresh.auto")
	// AttrKey: the lock key. On spans only (keys are unbounded).
	AttrKey = attribute.Key("dlock.key")
	// AttrAttempts: the attempts of an acquire. On spans.
	AttrAttempts = attribute.Key("dlock.attempts")
	// AttrToken: the fencing token of a lease. On spans.
	AttrToken = attribute.Key("dlock.token")
	// AttrTTL: the TTL granted, in seconds. On spans.
	AttrTTL = attribute.Key("dlock.ttl")
)

// Options configure an Observer. A nil *Options means all defaults.
type Options struct {
	// TracerProvider makes the tracer. Default: the global one
	// (go.opentelemetry.io/otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the meter. Default: the global one
	// (go.opentelemetry.io/otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
}

// Observer is an observe.Observer that records spans and metrics. Set it in
// dlock.Options.Observer. One Observer may serve many Lockers, of any
// backends; it is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer

	acquireDuration metric.Float64Histogram
	acquireAttempts metric.Int64Histogram
	refreshFailures metric.Int64Counter
	releases        metric.Int64Counter
	losses          metric.Int64Counter
	held            metric.Int64UpDownCounter
}

var _ observe.Observer = (*Observer)(nil)

// New returns an Observer on the providers of opts. The error is one from
// the MeterProvider, creating an instrument.
func New(opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = gotel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = gotel.GetMeterProvider()
	}
	obs := &Observer{tracer: o.TracerProvider.Tracer(ScopeName)}
	m := o.MeterProvider.Meter(ScopeName)
	var err error
	if obs.acquireDuration, err = m.Float64Histogram("dlock.acquire.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time an acquire took, waiting included."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)); err != nil {
		return nil, err
	}
	if obs.acquireAttempts, err = m.Int64Histogram("dlock.acquire.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts an acquire made on the backend."),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 5, 10, 20, 50, 100)); err != nil {
		return nil, err
	}
	if obs.refreshFailures, err = m.Int64Counter("dlock.refresh.failures",
		metric.WithUnit("{refresh}"),
		metric.WithDescription("Lease refreshes that failed.")); err != nil {
		return nil, err
	}
	if obs.releases, err = m.Int64Counter("dlock.releases",
		metric.WithUnit("{release}"),
		metric.WithDescription("Calls of Lease.Release, by outcome.")); err != nil {
		return nil, err
	}
	if obs.losses, err = m.Int64Counter("dlock.lease.losses",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost, by reason.")); err != nil {
		return nil, err
	}
	if obs.held, err = m.Int64UpDownCounter("dlock.leases.held",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now.")); err != nil {
		return nil, err
	}
	return obs, nil
}

// AcquireStart implements observe.Observer: it starts the span
// "dlock.acquire".
func (o *Observer) AcquireStart(ctx context.Context, e observe.AcquireStartEvent) context.Context {
	ctx, _ = o.tracer.Start(ctx, "dlock.acquire", trace.WithAttributes(
		AttrBackend.String(e.Backend), AttrKey.String(e.Key), AttrTry.Bool(e.Try)))
	return ctx
}

// AcquireEnd implements observe.Observer: it ends the span and records the
// acquire's duration and attempts.
func (o *Observer) AcquireEnd(ctx context.Context, e observe.AcquireEndEvent) {
	attrs := metric.WithAttributes(AttrBackend.String(e.Backend), AttrOutcome.String(string(e.Outcome)), AttrTry.Bool(e.Try))
	o.acquireDuration.Record(ctx, e.Wait.Seconds(), attrs)
	o.acquireAttempts.Record(ctx, int64(e.Attempts), attrs)
	if e.Outcome == observe.AcquireAcquired {
		o.held.Add(ctx, 1, metric.WithAttributes(AttrBackend.String(e.Backend)))
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrOutcome.String(string(e.Outcome)), AttrAttempts.Int(e.Attempts))
	if e.Outcome == observe.AcquireAcquired {
		span.SetAttributes(AttrToken.Int64(int64(e.Token)), AttrTTL.Float64(e.TTL.Seconds()))
	}
	if e.Outcome == observe.AcquireError {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End()
}

// Refresh implements observe.Observer: a span "dlock.refresh" for a call of
// Lease.Refresh, and the failure counter.
func (o *Observer) Refresh(ctx context.Context, e observe.RefreshEvent) {
	outcome := "ok"
	if e.Err != nil {
		outcome = "error"
		if isNotHeld(e.Err) {
			outcome = "not_held"
		}
		o.refreshFailures.Add(ctx, 1, metric.WithAttributes(
			AttrBackend.String(e.Backend), AttrOutcome.String(outcome), AttrAuto.Bool(e.Auto)))
	}
	if e.Auto {
		return
	}
	end := time.Now()
	_, span := o.tracer.Start(ctx, "dlock.refresh", trace.WithTimestamp(end.Add(-e.Duration)), trace.WithAttributes(
		AttrBackend.String(e.Backend), AttrKey.String(e.Key), AttrToken.Int64(int64(e.Token)),
		AttrOutcome.String(outcome)))
	if e.Err != nil {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	} else {
		span.SetAttributes(AttrTTL.Float64(e.Granted.Seconds()))
	}
	span.End(trace.WithTimestamp(end))
}

// Release implements observe.Observer: a span "dlock.release" and the
// release counter.
func (o *Observer) Release(ctx context.Context, e observe.ReleaseEvent) {
	o.releases.Add(ctx, 1, metric.WithAttributes(AttrBackend.String(e.Backend), AttrOutcome.String(string(e.Outcome))))
	end := time.Now()
	_, span := o.tracer.Start(ctx, "dlock.release", trace.WithTimestamp(end.Add(-e.Duration)), trace.WithAttributes(
		AttrBackend.String(e.Backend), AttrKey.String(e.Key), AttrToken.Int64(int64(e.Token)),
		AttrOutcome.String(string(e.Outcome))))
	if e.Outcome == observe.ReleaseError {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// LeaseEnd implements observe.Observer: the held-leases gauge, and the loss
// counter.
func (o *Observer) LeaseEnd(e observe.LeaseEndEvent) {
	ctx := context.Background()
	o.held.Add(ctx, -1, metric.WithAttributes(AttrBackend.String(e.Backend)))
	if e.Reason.Lost() {
		o.losses.Add(ctx, 1, metric.WithAttributes(AttrBackend.String(e.Backend), AttrReason.String(string(e.Reason))))
	}
}

func isNotHeld(err error) bool { return errors.Is(err, dlock.ErrNotHeld) }
