// Package redishub holds the Redis pub/sub hub's tests against real servers (in the development module, with the test servers); it has only tests.
package redishub
