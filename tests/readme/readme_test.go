// Package readme checks that the Go code of the repository's README
// compiles.
//
// The rule, stated at the top of the README too: every ```go block of the
// README is a complete file — `package main` with its imports, the free
// variables of a snippet turned into parameters of a function (for example
// `func run(ctx context.Context, storage Storage) error`) — so that a user
// can copy it. TestREADMEGoBlocksCompile writes each block (indented blocks,
// in list items, included) to a file of its own in a temporary directory and
// runs `go vet` on it with the tests module as the working directory: a
// file outside any module compiles in the context of the module (and the
// go.work) of the working directory, so the block's imports of dlock's
// modules and their clients resolve to this tree. A block that does not
// compile or vet, or is not gofmt-formatted, fails the test, named by its
// line in the README.
package readme

import (
	"bufio"
	"bytes"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmePath is the README, from this package's directory.
const readmePath = "../../README.md"

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

func TestREADMEGoBlocksCompile(t *testing.T) {
	md, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := goBlocks(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no ```go block: the extraction is broken", readmePath)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the README's blocks: %v", err)
	}
	module, err := filepath.Abs("..") // the tests module
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "main.go")
			if err := os.WriteFile(file, []byte(b.code), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(t.Context(), goTool, "vet", file)
			cmd.Dir = module
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("README.md:%d: the Go block does not compile as a file of its own (%v):\n%s\nThe block, as compiled:\n%s",
					b.line, err, strings.ReplaceAll(string(out), file, "block"), numbered(b.code))
			}
			if f, err := format.Source([]byte(b.code)); err == nil && string(f) != b.code {
				t.Errorf("README.md:%d: the Go block is not gofmt-formatted; formatted, it reads:\n%s", b.line, f)
			}
		})
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
