// Package servers holds the tests of
// github.com/dlock-go/dlock/conformance/servers that use the servers'
// clients (go-redis, the etcd client, go-zookeeper): they live in the tests
// module, which may depend on them, and the root module does not.
//
// The package has only tests.
package servers
