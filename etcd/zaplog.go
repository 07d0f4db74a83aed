package etcd

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapLogger returns a zap logger for the etcd client built from a URL that
// writes to log, the Locker's Logger, instead of the client's default
// (JSON lines on standard error). Before up is set (while Open waits for
// its first round trip, whose error names the last dial error) the client's
// lines go out at Debug, so a failed Open is not also a stream of warnings.
func zapLogger(log *slog.Logger, up *atomic.Bool) *zap.Logger {
	return zap.New(slogCore{log: log, up: up})
}

// slogCore is a zapcore.Core over a slog.Logger.
type slogCore struct {
	log    *slog.Logger
	up     *atomic.Bool
	fields []zapcore.Field
}

func (c slogCore) level(l zapcore.Level) slog.Level {
	switch {
	case !c.up.Load() || l < zapcore.InfoLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.log.Enabled(context.Background(), c.level(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	c.fields = append(c.fields[:len(c.fields):len(c.fields)], fields...)
	return c
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	args := make([]any, 0, 2*len(enc.Fields)+2)
	if e.LoggerName != "" {
		args = append(args, "logger", e.LoggerName)
	}
	for k, v := range enc.Fields {
		args = append(args, k, v)
	}
	c.log.Log(context.Background(), c.level(e.Level), "dlock/etcd: client: "+e.Message, args...)
	return nil
}

func (slogCore) Sync() error { return nil }
