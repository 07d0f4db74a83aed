module github.com/dlock-go/dlock/zookeeper

go 1.26.0

replace github.com/dlock-go/dlock => ..

require (
	github.com/dlock-go/dlock v0.1.0
	github.com/go-zookeeper/zk v1.0.4
)

require go.uber.org/goleak v1.3.0 // indirect
