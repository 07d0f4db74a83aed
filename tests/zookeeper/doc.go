// Package zookeeper holds the ZooKeeper backend's tests against real servers (in the development module, with the test servers); it has only tests.
package zookeeper
