package otel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memory"
	dlockotel "github.com/dlock-go/dlock/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// An Observer on the providers of your choice (here in-memory ones; nil
// Options use the global providers), set in dlock.Options.Observer: every
// acquire, refresh and release becomes spans and metrics.
func ExampleNew() {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	obs, err := dlockotel.New(&dlockotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}
	locker, err := memory.New(memory.NewStore(), &dlock.Options{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "orders/42", nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}

	for _, s := range spans.Ended() {
		fmt.Println("span", s.Name())
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == "dlock.releases" {
			fmt.Println("metric", m.Name, "recorded")
		}
	}
	// Output:
	// span dlock.acquire
	// span dlock.release
	// metric dlock.releases recorded
}
