//go:build !wasip1

// This test reads source files and runs the go command, which a wasip1 test binary cannot.

package proxywasm

import (
	"bytes"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The package promises the SDK's API (plus the extensions below) under every build. The builds cannot be compiled
// side by side, so this test reads the source each build would compile (selected by
// go/build with that build's GOOS, GOARCH and tags) and compares the exported
// declarations: the SDK's proxywasm package, this package as the standard toolchain
// builds it for wasip1, natively, and under TinyGo.

const sdkPackage = "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

// extensions are this package's additions to the SDK's API, in every build: reads that
// append to a caller's buffer instead of allocating their result, for filters' hot paths.
var extensions = map[string]string{
	"func AppendProperty":           "([]byte, []string) ([]byte, error)",
	"func AppendHttpRequestHeader":  "([]byte, string) ([]byte, error)",
	"func AppendHttpResponseHeader": "([]byte, string) ([]byte, error)",
	"func AppendSharedData":         "([]byte, string) ([]byte, uint32, error)",
}

func TestAPIMatchesSDKInEveryBuild(t *testing.T) {
	want := exportedAPI(t, sdkDir(t), buildContext("", "", nil))
	require.Contains(t, want, "func DispatchHttpCall", "sanity: the SDK's API was read")
	for k, v := range extensions {
		require.NotContains(t, want, k, "an extension the SDK has now")
		want[k] = v
	}

	for name, ctx := range map[string]build.Context{
		"wasip1":        buildContext("wasip1", "wasm", nil),
		"native":        buildContext("", "", nil),
		"tinygo wasip1": buildContext("wasip1", "wasm", []string{"tinygo"}),
	} {
		t.Run(name, func(t *testing.T) {
			got := exportedAPI(t, ".", ctx)
			assert.Equal(t, want, got)
		})
	}
}

func TestBuildsSelectTheIntendedFiles(t *testing.T) {
	assert.Equal(t, []string{"doc.go", "exports_wasip1.go", "imports_wasip1.go", "proxywasm_wasip1.go"},
		goFiles(t, ".", buildContext("wasip1", "wasm", nil)))
	assert.Equal(t, []string{"doc.go", "proxywasm.go"}, goFiles(t, ".", buildContext("", "", nil)))
	assert.Equal(t, []string{"doc.go", "proxywasm.go"},
		goFiles(t, ".", buildContext("wasip1", "wasm", []string{"tinygo"})))
}

func buildContext(goos, goarch string, tags []string) build.Context {
	ctx := build.Default
	if goos != "" {
		ctx.GOOS, ctx.GOARCH = goos, goarch
	}
	ctx.BuildTags = tags
	ctx.CgoEnabled = false
	return ctx
}

func sdkDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", sdkPackage).Output()
	require.NoError(t, err, "locating %s", sdkPackage)
	return strings.TrimSpace(string(out))
}

func goFiles(t *testing.T, dir string, ctx build.Context) []string {
	t.Helper()
	pkg, err := ctx.ImportDir(dir, 0)
	require.NoError(t, err)
	files := append([]string(nil), pkg.GoFiles...)
	sort.Strings(files)
	return files
}

// exportedAPI maps "func F", "method T.M" and "type T" to a normalised signature.
// Types are compared by name, their methods as methods: the forwarding build aliases the
// SDK's metric types (so it has the SDK's methods by construction, which are copied in
// here after checking the alias points at the SDK) and the wasip1 build declares its own.
func exportedAPI(t *testing.T, dir string, ctx build.Context) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	api := map[string]string{}
	aliases := map[string]string{} // our type name -> SDK type name
	for _, name := range goFiles(t, dir, ctx) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				key := "func " + d.Name.Name
				if d.Recv != nil {
					recv := strings.TrimPrefix(typeString(fset, d.Recv.List[0].Type), "*")
					if !token.IsExported(recv) {
						continue
					}
					key = "method " + recv + "." + d.Name.Name
				}
				api[key] = signature(fset, d.Type)
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					api["type "+ts.Name.Name] = "declared"
					if ts.Assign.IsValid() {
						aliases[ts.Name.Name] = sdkAliasTarget(t, f, ts)
					}
				}
			}
		}
	}
	if len(aliases) > 0 {
		sdkAPI := exportedAPI(t, sdkDir(t), buildContext("", "", nil))
		for ours, theirs := range aliases {
			for key, sig := range sdkAPI {
				if m, ok := strings.CutPrefix(key, "method "+theirs+"."); ok {
					api["method "+ours+"."+m] = sig
				}
			}
		}
	}
	return api
}

// sdkAliasTarget returns the SDK type an alias names, failing unless it is one.
func sdkAliasTarget(t *testing.T, f *ast.File, ts *ast.TypeSpec) string {
	t.Helper()
	sel, ok := ts.Type.(*ast.SelectorExpr)
	require.True(t, ok, "alias %s does not name a type of another package", ts.Name.Name)
	pkg := sel.X.(*ast.Ident).Name
	for _, imp := range f.Imports {
		if imp.Name != nil && imp.Name.Name == pkg || imp.Name == nil && strings.HasSuffix(imp.Path.Value, "/"+pkg+`"`) {
			require.Equal(t, `"`+sdkPackage+`"`, imp.Path.Value, "alias %s", ts.Name.Name)
			return sel.Sel.Name
		}
	}
	t.Fatalf("alias %s: package %s not imported", ts.Name.Name, pkg)
	return ""
}

func signature(fset *token.FileSet, ft *ast.FuncType) string {
	return "(" + strings.Join(fieldTypes(fset, ft.Params), ", ") + ") (" +
		strings.Join(fieldTypes(fset, ft.Results), ", ") + ")"
}

// fieldTypes lists one type per parameter, so `a, b int` and `a int, b int` compare
// equal and names do not matter.
func fieldTypes(fset *token.FileSet, fl *ast.FieldList) []string {
	if fl == nil {
		return nil
	}
	var out []string
	for _, f := range fl.List {
		n := max(len(f.Names), 1)
		for range n {
			out = append(out, typeString(fset, f.Type))
		}
	}
	return out
}

func typeString(fset *token.FileSet, e ast.Expr) string {
	var b bytes.Buffer
	if err := printer.Fprint(&b, fset, e); err != nil {
		panic(err)
	}
	// The SDK spells the empty interface the old way.
	return strings.ReplaceAll(b.String(), "interface{}", "any")
}
