package expr_test

import (
	"fmt"
	"strings"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

// A filter offers its expressions some attributes, each in a slot with a type. This one
// offers three; the telemetry filter's statsplan.Resolver offers Envoy's and Istio's.
var offered = []struct {
	name string
	typ  expr.Type
}{
	{"request.method", expr.String},
	{"request.headers.x-tenant", expr.String},
	{"response.code", expr.Int},
}

// resolve is the filter's expr.Resolver: request.headers['x-tenant'] arrives as the path
// ["request", "headers", "x-tenant"].
func resolve(path []string) (int, expr.Type, error) {
	name := strings.Join(path, ".")
	for slot, a := range offered {
		if a.name == name {
			return slot, a.typ, nil
		}
	}
	return 0, 0, fmt.Errorf("unknown attribute %s", name)
}

// request is one request's attribute values by slot, the filter's expr.Reader; a filter
// fills it from the host's headers and properties.
type request map[int]expr.Value

func (r request) Attr(slot int) (expr.Value, bool) {
	v, ok := r[slot]
	return v, ok
}

// Compile an expression once, when the filter is configured, then evaluate it for every
// request and format the result as a label value.
func ExampleCompile() {
	e, err := expr.Compile(`response.code >= 500 ? "error" : request.method`, resolve)
	if err != nil {
		panic(err)
	}
	fmt.Println("type:", e.Type())
	for _, r := range []request{
		{0: {Str: "GET"}, 2: {Int: 200}},
		{0: {Str: "POST"}, 2: {Int: 503}},
	} {
		v, ok := e.Eval(r)
		fmt.Println(expr.Format(e.Type(), v), ok)
	}
	// Output:
	// type: string
	// GET true
	// error true
}

// An expression outside the subset, of the wrong type or naming an attribute the
// resolver does not know is refused, with the column of what is wrong.
func ExampleCompile_error() {
	for _, src := range []string{
		`response.code == "200"`,
		`request.headers['x-user']`,
		`request.method.matches("^G")`,
	} {
		_, err := expr.Compile(src, resolve)
		fmt.Println(err)
	}
	// Output:
	// column 15: cannot compare int == string
	// column 1: unknown attribute request.headers.x-user
	// column 16: unsupported method matches()
}

// A missing attribute gives no value, unless has() asks for it or the other side of
// && or || decides the result, as in CEL.
func ExampleExpr_Eval() {
	noTenant := request{0: {Str: "GET"}}
	for _, src := range []string{
		`request.headers['x-tenant']`,
		`request.headers['x-tenant'] == "acme" || request.method == "GET"`,
		`has(request.headers['x-tenant']) ? request.headers['x-tenant'] : "none"`,
	} {
		e, err := expr.Compile(src, resolve)
		if err != nil {
			panic(err)
		}
		v, ok := e.Eval(noTenant)
		fmt.Printf("%s: %q %t\n", e, expr.Format(e.Type(), v), ok)
	}
	// Output:
	// request.headers['x-tenant']: "" false
	// request.headers['x-tenant'] == "acme" || request.method == "GET": "true" true
	// has(request.headers['x-tenant']) ? request.headers['x-tenant'] : "none": "none" true
}

func ExampleFormat() {
	fmt.Println(expr.Format(expr.Int, expr.Value{Int: 404}))
	fmt.Println(expr.Format(expr.Bool, expr.Value{Bool: true}))
	fmt.Println(expr.Format(expr.String, expr.Value{Str: "reviews"}))
	// Output:
	// 404
	// true
	// reviews
}
