// Package examples runs the backends' examples (each backend's
// example_test.go, its documentation) against real servers: the library's
// packages do not start servers, so their examples take the servers'
// addresses from environment variables that this package's test sets. It
// has only tests.
package examples
