//go:build !wasip1

// This test runs the go command, which a wasip1 test binary cannot.

package proxywasm

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The wasip1 layer relies on the compiler treating every pointer (and string) passed to
// a go:wasmimport function as escaping, so result slots and buffers handed to the host
// live on the heap: the host calls back into the guest during host calls, a callback can
// grow and so move the goroutine stack, and a stack slot whose address the host holds
// would then be stale. Nothing in the language promises this, so the test pins it by
// reading the compiler's escape analysis for imports_wasip1.go.
func TestHostCallPointersEscapeToHeap(t *testing.T) {
	const pkg = "github.com/wasmesh/wasmesh/filters/proxywasm"
	cmd := exec.Command("go", "build", "-gcflags="+pkg+"=-m", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	diagnostics := string(out)

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "imports_wasip1.go", nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	checked := 0
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body != nil {
			continue
		}
		for _, field := range fn.Type.Params.List {
			if !passesMemory(field.Type) {
				continue
			}
			for _, name := range field.Names {
				pos := fset.Position(name.Pos())
				want := fmt.Sprintf("imports_wasip1.go:%d:%d: leaking param: %s", pos.Line, pos.Column, name.Name)
				assert.True(t, strings.Contains(diagnostics, want), "%s of %s does not escape", name.Name, fn.Name.Name)
				checked++
			}
		}
	}
	assert.Greater(t, checked, 30, "sanity: the host functions' memory parameters were found")
}

func passesMemory(e ast.Expr) bool {
	if _, ok := e.(*ast.StarExpr); ok {
		return true
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "string"
}
