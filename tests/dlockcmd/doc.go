// Package dlockcmd holds the dlock command's tests against real servers (in
// the development module, with the test servers); it has only tests. They
// build the command (the cmd/dlock module of this checkout, through the
// workspace) and run the binary.
package dlockcmd
