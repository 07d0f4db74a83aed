// Command etcd is the etcd server, built from its Go module for dlock's
// tests.
//
// scripts/test.sh builds it (CGO_ENABLED=0, a static binary) into the
// stand-in etcd image it makes on machines that cannot pull the official
// one. The version is pinned to the one the library's client uses
// (go.etcd.io/etcd/client/v3 v3.7.3), so the tests run against the server
// release the client was made for. It is a separate module so that the
// server's dependencies stay out of the library's go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
