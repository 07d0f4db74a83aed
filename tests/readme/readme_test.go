// Package readme checks that the Go code of the repository's README and of
// its docs/ pages compiles.
//
// The rules, stated at the top of each file too:
//
//   - Every ```go block of the README is a complete program — `package
//     main` with its imports and a `func main` — so that a user can copy
//     it into a main.go and run it. TestGoBlocks builds each one with
//     `go build` (so a missing main, or an unused variable, fails) and
//     vets it.
//   - A ```go block of a docs/*.md page is a complete file as well: a
//     program when it declares `func main` (built and vetted, as in the
//     README), otherwise a fragment in `package main` whose free variables
//     are the parameters of a function (for example
//     `func run(ctx context.Context, storage Storage) error`), which is
//     type-checked and vetted but, having no main, not built.
//
// Each block (indented blocks, in list items, included) is written to a
// file of its own in a temporary directory, and the go command runs on it
// with the tests module as the working directory: a file outside any
// module compiles in the context of the module (and the go.work) of the
// working directory, so the block's imports of dlock's modules and their
// clients resolve to this tree. A block that does not compile or vet, or
// is not gofmt-formatted, fails the test, named by its file and line.
package readme

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The files checked, from this package's directory: the README, whose
// blocks must all be programs, and the docs pages.
const (
	readmePath = "../../README.md"
	docsGlob   = "../../docs/*.md"
)

// block is one ```go block of a Markdown file.
type block struct {
	line int    // the line of its opening fence, 1-based
	code string // its text, the fence's indentation removed
}

// goBlocks returns the ```go blocks of md, in order. A block ends at the
// first closing fence with the opening fence's indentation; each of its
// lines loses that indentation.
func goBlocks(md []byte) ([]block, error) {
	var (
		blocks []block
		cur    *block
		indent string
		code   strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		if cur == nil {
			if strings.TrimSpace(trimmed) == "```go" {
				cur = &block{line: n}
				indent = line[:len(line)-len(trimmed)]
				code.Reset()
			}
			continue
		}
		if strings.TrimSpace(line) == "```" && strings.HasPrefix(line, indent) {
			cur.code = code.String()
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		code.WriteString(strings.TrimPrefix(line, indent))
		code.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("the ```go block at line %d is not closed", cur.line)
	}
	return blocks, nil
}

// isProgram reports whether code is a program: package main with a
// func main. Code that does not parse is not one (the compiler then says
// why).
func isProgram(code string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", code, parser.SkipObjectResolution)
	if err != nil || f.Name.Name != "main" {
		return false
	}
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "main" {
			return true
		}
	}
	return false
}

// TestREADMEGoBlocksCompile checks the README's blocks (all programs) and
// those of the docs pages.
func TestREADMEGoBlocksCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the README's blocks: %v", err)
	}
	module, err := filepath.Abs("..") // the tests module
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(docsGlob)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append([]string{readmePath}, docs...) {
		name := strings.TrimPrefix(path, "../../")
		md, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := goBlocks(md)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mustBePrograms := path == readmePath
		if mustBePrograms && len(blocks) == 0 {
			t.Fatalf("%s has no ```go block: the extraction is broken", name)
		}
		for _, b := range blocks {
			t.Run(fmt.Sprintf("%s:%d", name, b.line), func(t *testing.T) {
				t.Parallel()
				checkBlock(t, goTool, module, name, b, mustBePrograms)
			})
		}
	}
}

// checkBlock compiles b, a block of the file name, in the module: a
// program with go build, then go vet; a fragment (refused where
// mustBeProgram) with go vet alone.
func checkBlock(t *testing.T, goTool, module, name string, b block, mustBeProgram bool) {
	program := isProgram(b.code)
	if mustBeProgram && !program {
		t.Errorf("%s:%d: the Go block is not a complete program (package main with a func main), as the file's header says each one is:\n%s",
			name, b.line, numbered(b.code))
		return
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(b.code), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := [][]string{{"vet", file}}
	what := "a fragment of its own (vetted)"
	if program {
		steps = [][]string{{"build", "-o", filepath.Join(dir, "prog"), file}, {"vet", file}}
		what = "a program of its own (built and vetted)"
	}
	for _, args := range steps {
		cmd := exec.CommandContext(t.Context(), goTool, args...)
		cmd.Dir = module
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s:%d: go %s: the Go block does not compile as %s (%v):\n%s\nThe block, as compiled:\n%s",
				name, b.line, args[0], what, err, strings.ReplaceAll(string(out), file, "block"), numbered(b.code))
		}
	}
	if f, err := format.Source([]byte(b.code)); err == nil && string(f) != b.code {
		t.Errorf("%s:%d: the Go block is not gofmt-formatted; formatted, it reads:\n%s", name, b.line, f)
	}
}

// numbered returns code with line numbers, as the compiler counts them.
func numbered(code string) string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimSuffix(code, "\n"), "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, l)
	}
	return b.String()
}

func TestGoBlocks(t *testing.T) {
	md := "text\n```go\npackage a\n```\n\n- item\n\n  ```go\n  package b\n\n  \tx\n  ```\n```sh\nls\n```\n"
	got, err := goBlocks([]byte(md))
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{line: 2, code: "package a\n"}, {line: 8, code: "package b\n\n\tx\n"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("goBlocks = %+v, want %+v", got, want)
	}
	if _, err := goBlocks([]byte("```go\npackage a\n")); err == nil {
		t.Error("an unclosed block: no error")
	}
}

func TestIsProgram(t *testing.T) {
	for _, c := range []struct {
		code string
		want bool
	}{
		{"package main\n\nfunc main() {}\n", true},
		{"package main\n\nfunc run() error { return nil }\n", false},        // a fragment
		{"package lib\n\nfunc main() {}\n", false},                          // not package main
		{"package main\n\ntype T struct{}\n\nfunc (T) main() {}\n", false},  // a method
		{"package main\n\nfunc main() {\n", false},                          // does not parse
		{"package main\n\nvar main = func() {}\n\nfunc init() {}\n", false}, // no func main
		{"// A comment.\npackage main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println() }\n", true},
	} {
		if got := isProgram(c.code); got != c.want {
			t.Errorf("isProgram(%q) = %v, want %v", c.code, got, c.want)
		}
	}
}
