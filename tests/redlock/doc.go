// Package redlock holds the Redlock backend's tests against real servers (in the development module, with the test servers); it has only tests.
package redlock
