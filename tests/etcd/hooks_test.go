package etcd_test

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testhook"
)

// The etcd backend's internals these tests need, registered in
// etcd/testhooks.go (see there for what each does).
var (
	ownClient      = testhook.Get[func(*etcd.Driver)]("etcd.OwnClient")
	afterQueueRead = testhook.Get[func(*etcd.Driver, func())]("etcd.AfterQueueRead")
	afterMove      = testhook.Get[func(*etcd.Driver, func(error) error)]("etcd.AfterMove")
	breakWatch     = testhook.Get[func(*etcd.Driver)]("etcd.BreakWatch")
	watchCreated   = testhook.Get[func(*etcd.Driver) <-chan struct{}]("etcd.WatchCreated")
	poolSize       = testhook.Get[func(*etcd.Driver) int]("etcd.PoolSize")
	dirWatches     = testhook.Get[func(*etcd.Driver) int]("etcd.DirWatches")
	beforeWatch    = testhook.Get[func(*etcd.Driver, func())]("etcd.BeforeWatch")
	maxDirWatches  = testhook.Get[func() int]("etcd.MaxDirWatches")
	watchEvents    = testhook.Get[func(*etcd.Driver) int64]("etcd.WatchEvents")
	watchesMade    = testhook.Get[func(*etcd.Driver) int]("etcd.WatchesMade")
	setWatchLinger = testhook.Get[func(time.Duration) time.Duration]("etcd.SetWatchLinger")
	loggerOf       = testhook.Get[func(*etcd.Driver) *slog.Logger]("etcd.LoggerOf")
	injectFault    = testhook.Get[func(*etcd.Driver, func(doing string, id clientv3.LeaseID) error)]("etcd.InjectFault")
	holdMove       = testhook.Get[func(*etcd.Driver, func(to clientv3.LeaseID, commit func(context.Context) (bool, error)) error)]("etcd.HoldMove")
)
