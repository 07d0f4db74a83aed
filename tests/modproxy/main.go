// Command modproxy writes a file-based Go module proxy (the GOPROXY
// protocol's layout, https://go.dev/ref/mod#goproxy-protocol) holding one
// version of each module directory it is given, so that a consumer can
// `go get` dlock's modules as the published ones, with no replace
// directive: GOPROXY=file:///that/dir,... (scripts/proxycheck.sh).
//
// Usage:
//
//	modproxy -out DIR -version VERSION [-time RFC3339] MODULE_DIR...
//
// For each MODULE_DIR (a directory with a go.mod, normally in a checkout of
// the release's tags) it writes DIR/<escaped module path>/@v/list,
// VERSION.info, VERSION.mod and VERSION.zip; the zip is made by
// golang.org/x/mod/zip.CreateFromDir, which leaves out nested modules (a
// subdirectory with its own go.mod) and VCS directories, as the proxy's
// zips of a tag do.
//
// It lives in the tests module so that golang.org/x/mod enters no library
// module's go.mod.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	out := flag.String("out", "", "the proxy directory to write (created if missing)")
	version := flag.String("version", "", "the version of every module (a semantic version such as v0.1.0)")
	at := flag.String("time", "", "the version's time in the .info files (RFC 3339; default now)")
	flag.Parse()
	if err := run(*out, *version, *at, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(out, version, at string, dirs []string) error {
	if out == "" || version == "" || len(dirs) == 0 {
		return errors.New("usage: modproxy -out DIR -version VERSION [-time RFC3339] MODULE_DIR...")
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("version %q is not a canonical semantic version", version)
	}
	t := time.Now().UTC()
	if at != "" {
		var err error
		if t, err = time.Parse(time.RFC3339, at); err != nil {
			return fmt.Errorf("-time: %w", err)
		}
	}
	for _, dir := range dirs {
		if err := write(out, version, t, dir); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// write adds the module in dir at version to the proxy in out.
func write(out, version string, t time.Time, dir string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return errors.New("go.mod names no module")
	}
	mv := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return err
	}
	esc, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	var zip bytes.Buffer
	if err := modzip.CreateFromDir(&zip, mv, dir); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t})
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{version + ".zip", zip.Bytes()},
		{version + ".mod", gomod},
		{version + ".info", info},
		{"list", []byte(version + "\n")},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(vdir, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
