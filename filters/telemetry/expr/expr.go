// Package expr compiles and evaluates expressions in a subset of CEL, the language Istio's
// stats plugin evaluates dimension and value expressions in (the Telemetry API's
// tagOverrides values and the stats configuration's metrics[].dimensions and
// definitions[].value). It is pure Go: a proxy-wasm filter compiles expressions
// when it is configured and evaluates them per request, and tests run natively.
//
// An expression is parsed and type-checked once, by [Compile], into a tree of evaluators;
// anything outside the subset is an error, so an expression either means what it means in
// Istio or is refused:
//
//	attributes   request.host  request.headers['x-user']  response.code  upstream_peer.labels['app']
//	             (paths of .name or ['name'] segments, resolved by the caller's [Resolver])
//	literals     'single' "double" (escapes \\ \' \" \n \r \t), 123, true, false
//	functions    has(attribute)  string(x)  int(x)  size(string)
//	methods      s.startsWith(t)  s.endsWith(t)  s.contains(t)
//	operators    ! - (unary)  + (strings, ints)  - (ints)  == !=  < <= > >= (ints, strings)
//	             && ||  c ? a : b
//
// Types are string, int and bool, checked statically. Which attributes exist, and their
// types, is the caller's: a [Resolver] gives each attribute path a slot and a type (the
// telemetry filter's statsplan.Resolver knows Envoy's and Istio's attributes), and at
// evaluation a [Reader] gives the value in each slot for one request. As in CEL, reading
// an attribute the reader does not have is an error value; && and || absorb it when the
// other side decides the result, has() turns it into false, and anything else propagates
// it, so [Expr.Eval] reports no value (Istio then reports a dimension as "unknown" and
// records no metric value).
package expr

import (
	"strconv"
)

// Type is the static type of an expression or attribute.
type Type uint8

// The types of the subset.
const (
	String Type = iota + 1
	Int
	Bool
)

func (t Type) String() string {
	switch t {
	case String:
		return "string"
	case Int:
		return "int"
	case Bool:
		return "bool"
	}
	return "invalid"
}

// Value is an attribute's or an expression's value. Which field is meaningful follows
// from the static type: Str for [String], Int for [Int], Bool for [Bool].
type Value struct {
	Str  string
	Int  int64
	Bool bool
}

// Reader gives evaluation the attribute values of one request, by the slots the
// [Resolver] assigned; false for an attribute the request does not have.
type Reader interface {
	Attr(slot int) (Value, bool)
}

// Resolver maps an attribute path (request.headers['x-user'] is
// ["request", "headers", "x-user"]) to a slot, which [Reader] is asked for at evaluation,
// and the attribute's type. It reports unknown and unsupported attributes as errors, which
// [Compile] returns with the column of the attribute.
type Resolver func(path []string) (slot int, t Type, err error)

// Expr is a compiled, type-checked expression. It is immutable, and safe to evaluate
// from several goroutines if the readers are.
type Expr struct {
	root node
	src  string
}

// node is a node of a compiled expression.
type node interface {
	typ() Type
	// eval returns the value, or false when evaluation errs (a missing attribute, an
	// unparsable int, an overflow).
	eval(r Reader) (Value, bool)
}

// Compile parses and type-checks src, resolving the attributes it names with resolve.
// Errors name the column (from 1) of what is wrong.
func Compile(src string, resolve Resolver) (*Expr, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	tree, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tokEOF {
		return nil, posErr(t.pos, "unexpected %s", t)
	}
	root, err := (&checker{resolve: resolve}).check(tree)
	if err != nil {
		return nil, err
	}
	return &Expr{root: root, src: src}, nil
}

// Type is the expression's static type: every value [Expr.Eval] returns is of it.
func (e *Expr) Type() Type { return e.root.typ() }

// Eval evaluates the expression for the request r reads; false when it has no value (an
// attribute it needs is missing, int() of a string that is not a number, an int overflow).
// It does not allocate unless the expression builds a string (+ of strings, string()).
func (e *Expr) Eval(r Reader) (Value, bool) { return e.root.eval(r) }

// String returns the expression's source.
func (e *Expr) String() string { return e.src }

// Format renders a value of type t as Istio writes it into a label: strings as they are,
// ints in decimal, bools as true or false.
func Format(t Type, v Value) string {
	switch t {
	case Int:
		return strconv.FormatInt(v.Int, 10)
	case Bool:
		return strconv.FormatBool(v.Bool)
	}
	return v.Str
}

// IsIdentifier reports whether s is an identifier of the language: a letter or
// underscore, then letters, digits and underscores. Attribute path segments that are
// identifiers can be written with a dot (request.host), others only as ['...'].
func IsIdentifier(s string) bool {
	if s == "" || !isIdentStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdentStart(s[i]) && !isDigit(s[i]) {
			return false
		}
	}
	return true
}
