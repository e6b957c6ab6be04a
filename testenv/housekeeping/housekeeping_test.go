// Package housekeeping holds the rules that keep the code easy to live in, checked over
// every room: no function over 150 lines, and no file over 800 lines in controlplane/
// outside tests.
package housekeeping

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

const (
	maxFunctionLines = 150
	maxFileLines     = 800
)

func TestFunctionsAndFilesStayShort(t *testing.T) {
	root := meshtest.Root()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "build", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		check(t, path, rel)
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found the project's Go files")
}

func check(t *testing.T, path, rel string) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	require.NoError(t, err)
	if lines := fset.File(f.Pos()).LineCount(); strings.HasPrefix(rel, "controlplane/") &&
		!strings.HasSuffix(rel, "_test.go") && !ast.IsGenerated(f) {
		assert.LessOrEqual(t, lines, maxFileLines, "%s has %d lines: split it by what its parts provide", rel, lines)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		var body *ast.BlockStmt
		name := "a function literal"
		switch fn := n.(type) {
		case *ast.FuncDecl:
			body, name = fn.Body, fn.Name.Name
		case *ast.FuncLit:
			body = fn.Body
		}
		if body != nil {
			lines := fset.Position(body.Rbrace).Line - fset.Position(body.Lbrace).Line - 1
			assert.LessOrEqual(t, lines, maxFunctionLines, "%s:%d: %s has %d lines",
				rel, fset.Position(body.Lbrace).Line, name, lines)
		}
		return true
	})
}
