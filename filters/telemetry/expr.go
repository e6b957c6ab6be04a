package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Expressions are a subset of CEL, the language Istio's stats plugin evaluates dimension
// and value expressions in. They are parsed and type-checked once, at configure time,
// into a tree of evaluators; anything outside the subset is a configuration error, so a
// configuration either means the same as in Istio or is refused.
//
//	attributes   request.host  request.headers['x-user']  response.code  destination.port
//	             upstream_peer.labels['app']  downstream_peer.workload  node.metadata['MESH_ID']
//	             filter_state['key']   (paths use .name or ['name'] segments; see attrs.go)
//	literals     'single' "double" (escapes \\ \' \" \n \r \t), 123, true, false
//	functions    has(attribute)  string(x)  int(x)  size(string)
//	methods      s.startsWith(t)  s.endsWith(t)  s.contains(t)
//	operators    ! - (unary)  + (strings, ints)  - (ints)  == !=  < <= > >= (ints, strings)
//	             && ||  c ? a : b
//
// Types are string, int and bool, checked statically. As in CEL, reading an attribute the
// host does not have is an error value; && and || absorb it when the other side decides
// the result, has() turns it into false, and anything else propagates it, so a dimension
// reports "unknown" (as Istio does) and a metric value is not recorded.

// valType is the static type of an expression.
type valType uint8

const (
	typeString valType = iota + 1
	typeInt
	typeBool
)

func (t valType) String() string {
	switch t {
	case typeString:
		return "string"
	case typeInt:
		return "int"
	case typeBool:
		return "bool"
	}
	return "invalid"
}

// value holds a result; which field is meaningful follows from the static type.
type value struct {
	s string
	i int64
	b bool
}

// attrReader gives evaluation the attribute values of one request, by slot.
type attrReader interface {
	attr(slot int) (value, bool)
}

// expression is a compiled, type-checked expression.
type expression interface {
	typ() valType
	// eval returns the value, or false when evaluation errs (a missing attribute, an
	// unparsable int, an overflow).
	eval(r attrReader) (value, bool)
}

// attrResolver maps an attribute path to a slot and its type; it reports unknown and
// unsupported attributes as errors.
type attrResolver func(path []string) (slot int, t valType, err error)

// compileExpr parses and type-checks src.
func compileExpr(src string, resolve attrResolver) (expression, error) {
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
	return (&checker{resolve: resolve}).check(tree)
}

func posErr(pos int, format string, args ...any) error {
	return fmt.Errorf("column %d: %s", pos+1, fmt.Sprintf(format, args...))
}

// Lexer.

type tokKind uint8

const (
	tokEOF tokKind = iota
	tokIdent
	tokString
	tokInt
	tokPunct
)

type token struct {
	kind tokKind
	text string // identifier or punctuation; the source text for literals
	str  string // decoded string literal
	pos  int
}

func (t token) String() string {
	switch t.kind {
	case tokEOF:
		return "end of expression"
	case tokString, tokInt:
		return "literal " + t.text
	}
	return strconv.Quote(t.text)
}

func lex(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case isIdentStart(c):
			j := i + 1
			for j < len(src) && (isIdentStart(src[j]) || isDigit(src[j])) {
				j++
			}
			toks = append(toks, token{kind: tokIdent, text: src[i:j], pos: i})
			i = j
		case isDigit(c):
			j := i
			for j < len(src) && isDigit(src[j]) {
				j++
			}
			if j < len(src) && (isIdentStart(src[j]) || src[j] == '.') {
				return nil, posErr(i, "unsupported number literal %q (only decimal ints are supported)", src[i:min(j+1, len(src))])
			}
			// Parsed by the parser, which knows whether a minus sign belongs to it.
			toks = append(toks, token{kind: tokInt, text: src[i:j], pos: i})
			i = j
		case c == '\'' || c == '"':
			s, n, err := lexString(src[i:])
			if err != nil {
				return nil, posErr(i, "%v", err)
			}
			toks = append(toks, token{kind: tokString, text: src[i : i+n], str: s, pos: i})
			i += n
		default:
			if i+1 < len(src) {
				switch two := src[i : i+2]; two {
				case "==", "!=", "<=", ">=", "&&", "||":
					toks = append(toks, token{kind: tokPunct, text: two, pos: i})
					i += 2
					continue
				}
			}
			if strings.IndexByte(".[]()?:<>+-!,*/%", c) < 0 {
				return nil, posErr(i, "unexpected character %q", rune(c))
			}
			toks = append(toks, token{kind: tokPunct, text: src[i : i+1], pos: i})
			i++
		}
	}
	return append(toks, token{kind: tokEOF, pos: len(src)}), nil
}

func isIdentStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool      { return c >= '0' && c <= '9' }

// lexString decodes the quoted string at the start of s, returning it and the number of
// source bytes it took.
func lexString(s string) (string, int, error) {
	q := s[0]
	if len(s) >= 3 && s[1] == q && s[2] == q {
		return "", 0, errors.New("triple-quoted strings are not supported")
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\n':
			return "", 0, errors.New("newline in string literal")
		case c == '\\':
			if i+1 >= len(s) {
				return "", 0, errors.New("unterminated string literal")
			}
			i++
			switch s[i] {
			case '\\', '\'', '"':
				b.WriteByte(s[i])
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			default:
				return "", 0, fmt.Errorf("unsupported escape \\%c", s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, errors.New("unterminated string literal")
}

// Parser: CEL's grammar, precedence lowest first: ?:, ||, &&, relations, + -, * / %
// (recognised to give a clear error), unary ! -, member access, index and calls.

type astKind uint8

const (
	astLit astKind = iota
	astIdent
	astSelect // recv.name
	astIndex  // recv[args[0]]
	astCall   // name(args) or recv.name(args)
	astUnary  // name args[0]
	astBinary // args[0] name args[1]
	astCond   // args[0] ? args[1] : args[2]
)

type ast struct {
	kind    astKind
	pos     int
	name    string
	lit     value
	litType valType
	recv    *ast
	args    []*ast
}

type parser struct {
	toks []token
	i    int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

func (p *parser) isPunct(s string) bool {
	t := p.peek()
	return t.kind == tokPunct && t.text == s
}

func (p *parser) expect(s string) error {
	if !p.isPunct(s) {
		t := p.peek()
		return posErr(t.pos, "expected %q, found %s", s, t)
	}
	p.next()
	return nil
}

func (p *parser) parseExpr() (*ast, error) {
	c, err := p.parseBinary(0)
	if err != nil || !p.isPunct("?") {
		return c, err
	}
	pos := p.next().pos
	a, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if err := p.expect(":"); err != nil {
		return nil, err
	}
	b, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	return &ast{kind: astCond, pos: pos, args: []*ast{c, a, b}}, nil
}

// binaryLevels lists the binary operators by increasing precedence.
var binaryLevels = [...][]string{
	{"||"},
	{"&&"},
	{"==", "!=", "<", "<=", ">", ">="},
	{"+", "-"},
	{"*", "/", "%"},
}

func (p *parser) parseBinary(level int) (*ast, error) {
	if level == len(binaryLevels) {
		return p.parseUnary()
	}
	left, err := p.parseBinary(level + 1)
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		if t.kind != tokPunct || !contains(binaryLevels[level], t.text) {
			return left, nil
		}
		p.next()
		right, err := p.parseBinary(level + 1)
		if err != nil {
			return nil, err
		}
		left = &ast{kind: astBinary, pos: t.pos, name: t.text, args: []*ast{left, right}}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (p *parser) parseUnary() (*ast, error) {
	if p.isPunct("!") || p.isPunct("-") {
		t := p.next()
		// A minus directly before an int literal is part of the literal, so that the
		// smallest int64 can be written.
		if t.text == "-" && p.peek().kind == tokInt {
			n := p.next()
			v, err := strconv.ParseInt("-"+n.text, 10, 64)
			if err != nil {
				return nil, posErr(t.pos, "int literal -%s out of range", n.text)
			}
			return p.parsePostfix(&ast{kind: astLit, pos: t.pos, lit: value{i: v}, litType: typeInt})
		}
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		return &ast{kind: astUnary, pos: t.pos, name: t.text, args: []*ast{x}}, nil
	}
	prim, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	return p.parsePostfix(prim)
}

func (p *parser) parsePrimary() (*ast, error) {
	t := p.next()
	switch t.kind {
	case tokInt:
		n, err := strconv.ParseInt(t.text, 10, 64)
		if err != nil {
			return nil, posErr(t.pos, "int literal %s out of range", t.text)
		}
		return &ast{kind: astLit, pos: t.pos, lit: value{i: n}, litType: typeInt}, nil
	case tokString:
		return &ast{kind: astLit, pos: t.pos, lit: value{s: t.str}, litType: typeString}, nil
	case tokIdent:
		switch t.text {
		case "true", "false":
			return &ast{kind: astLit, pos: t.pos, lit: value{b: t.text == "true"}, litType: typeBool}, nil
		case "null":
			return nil, posErr(t.pos, "null is not supported")
		}
		if p.isPunct("(") {
			args, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			return &ast{kind: astCall, pos: t.pos, name: t.text, args: args}, nil
		}
		return &ast{kind: astIdent, pos: t.pos, name: t.text}, nil
	case tokPunct:
		switch t.text {
		case "(":
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			return e, p.expect(")")
		case "[":
			return nil, posErr(t.pos, "list literals are not supported")
		}
	}
	return nil, posErr(t.pos, "unexpected %s", t)
}

func (p *parser) parseArgs() ([]*ast, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	var args []*ast
	if p.isPunct(")") {
		p.next()
		return args, nil
	}
	for {
		a, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
		if p.isPunct(",") {
			p.next()
			continue
		}
		return args, p.expect(")")
	}
}

func (p *parser) parsePostfix(x *ast) (*ast, error) {
	for {
		switch {
		case p.isPunct("."):
			p.next()
			t := p.next()
			if t.kind != tokIdent {
				return nil, posErr(t.pos, "expected a field name after '.', found %s", t)
			}
			if p.isPunct("(") {
				args, err := p.parseArgs()
				if err != nil {
					return nil, err
				}
				x = &ast{kind: astCall, pos: t.pos, name: t.text, recv: x, args: args}
				continue
			}
			x = &ast{kind: astSelect, pos: t.pos, name: t.text, recv: x}
		case p.isPunct("["):
			pos := p.next().pos
			key, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if err := p.expect("]"); err != nil {
				return nil, err
			}
			x = &ast{kind: astIndex, pos: pos, recv: x, args: []*ast{key}}
		default:
			return x, nil
		}
	}
}

// Type checker: turns the syntax tree into evaluators.

type checker struct {
	resolve attrResolver
}

func (c *checker) check(a *ast) (expression, error) {
	switch a.kind {
	case astLit:
		return &litExpr{t: a.litType, v: a.lit}, nil
	case astIdent, astSelect, astIndex:
		slot, t, err := c.attribute(a)
		if err != nil {
			return nil, err
		}
		return &attrExpr{slot: slot, t: t}, nil
	case astCall:
		return c.call(a)
	case astUnary:
		x, err := c.check(a.args[0])
		if err != nil {
			return nil, err
		}
		if a.name == "!" {
			if x.typ() != typeBool {
				return nil, posErr(a.pos, "operator ! needs a bool, not %s", x.typ())
			}
			return &notExpr{x: x}, nil
		}
		if x.typ() != typeInt {
			return nil, posErr(a.pos, "unary - needs an int, not %s", x.typ())
		}
		return &negExpr{x: x}, nil
	case astBinary:
		return c.binary(a)
	case astCond:
		cond, err := c.check(a.args[0])
		if err != nil {
			return nil, err
		}
		if cond.typ() != typeBool {
			return nil, posErr(a.pos, "the condition of ?: must be a bool, not %s", cond.typ())
		}
		x, err := c.check(a.args[1])
		if err != nil {
			return nil, err
		}
		y, err := c.check(a.args[2])
		if err != nil {
			return nil, err
		}
		if x.typ() != y.typ() {
			return nil, posErr(a.pos, "the branches of ?: have different types (%s and %s)", x.typ(), y.typ())
		}
		return &condExpr{c: cond, a: x, b: y}, nil
	}
	return nil, posErr(a.pos, "unsupported expression")
}

// attribute resolves a select/index chain rooted at an identifier.
func (c *checker) attribute(a *ast) (int, valType, error) {
	path, err := attributePath(a)
	if err != nil {
		return 0, 0, err
	}
	slot, t, err := c.resolve(path)
	if err != nil {
		return 0, 0, posErr(rootPos(a), "%v", err)
	}
	return slot, t, nil
}

func attributePath(a *ast) ([]string, error) {
	switch a.kind {
	case astIdent:
		return []string{a.name}, nil
	case astSelect:
		p, err := attributePath(a.recv)
		return append(p, a.name), err
	case astIndex:
		p, err := attributePath(a.recv)
		if err != nil {
			return nil, err
		}
		key := a.args[0]
		if key.kind != astLit || key.litType != typeString {
			return nil, posErr(a.pos, "only string literal keys are supported in [...]")
		}
		return append(p, key.lit.s), nil
	}
	return nil, posErr(a.pos, "only attributes can be selected from or indexed")
}

func rootPos(a *ast) int {
	for a.recv != nil {
		a = a.recv
	}
	return a.pos
}

func (c *checker) call(a *ast) (expression, error) {
	if a.recv != nil {
		return c.method(a)
	}
	if len(a.args) != 1 {
		return nil, posErr(a.pos, "%s() takes one argument, got %d", a.name, len(a.args))
	}
	if a.name == "has" {
		arg := a.args[0]
		if arg.kind != astSelect && arg.kind != astIndex && arg.kind != astIdent {
			return nil, posErr(arg.pos, "has() needs an attribute")
		}
		slot, _, err := c.attribute(arg)
		if err != nil {
			return nil, err
		}
		return &hasExpr{slot: slot}, nil
	}
	x, err := c.check(a.args[0])
	if err != nil {
		return nil, err
	}
	switch a.name {
	case "string":
		return &toStringExpr{x: x}, nil
	case "int":
		if x.typ() == typeBool {
			return nil, posErr(a.pos, "int() of a bool is not supported")
		}
		return &toIntExpr{x: x}, nil
	case "size":
		if x.typ() != typeString {
			return nil, posErr(a.pos, "size() needs a string, not %s", x.typ())
		}
		return &sizeExpr{x: x}, nil
	}
	return nil, posErr(a.pos, "unsupported function %s()", a.name)
}

func (c *checker) method(a *ast) (expression, error) {
	var fn func(s, t string) bool
	switch a.name {
	case "startsWith":
		fn = strings.HasPrefix
	case "endsWith":
		fn = strings.HasSuffix
	case "contains":
		fn = strings.Contains
	default:
		return nil, posErr(a.pos, "unsupported method %s()", a.name)
	}
	if len(a.args) != 1 {
		return nil, posErr(a.pos, "%s() takes one argument, got %d", a.name, len(a.args))
	}
	recv, err := c.check(a.recv)
	if err != nil {
		return nil, err
	}
	arg, err := c.check(a.args[0])
	if err != nil {
		return nil, err
	}
	if recv.typ() != typeString || arg.typ() != typeString {
		return nil, posErr(a.pos, "%s() works on strings, not %s and %s", a.name, recv.typ(), arg.typ())
	}
	return &methodExpr{recv: recv, arg: arg, fn: fn}, nil
}

func (c *checker) binary(a *ast) (expression, error) {
	x, err := c.check(a.args[0])
	if err != nil {
		return nil, err
	}
	y, err := c.check(a.args[1])
	if err != nil {
		return nil, err
	}
	tx, ty := x.typ(), y.typ()
	switch a.name {
	case "&&", "||":
		if tx != typeBool || ty != typeBool {
			return nil, posErr(a.pos, "operator %s needs bools, not %s and %s", a.name, tx, ty)
		}
		return &logicExpr{a: x, b: y, and: a.name == "&&"}, nil
	case "==", "!=":
		if tx != ty {
			return nil, posErr(a.pos, "cannot compare %s %s %s", tx, a.name, ty)
		}
		return &eqExpr{a: x, b: y, neg: a.name == "!="}, nil
	case "<", "<=", ">", ">=":
		if tx != ty || tx == typeBool {
			return nil, posErr(a.pos, "operator %s needs two ints or two strings, not %s and %s", a.name, tx, ty)
		}
		return &cmpExpr{a: x, b: y, op: a.name}, nil
	case "+":
		if tx != ty || tx == typeBool {
			return nil, posErr(a.pos, "operator + needs two strings or two ints, not %s and %s", tx, ty)
		}
		return &addExpr{a: x, b: y}, nil
	case "-":
		if tx != typeInt || ty != typeInt {
			return nil, posErr(a.pos, "operator - needs ints, not %s and %s", tx, ty)
		}
		return &addExpr{a: x, b: y, sub: true}, nil
	}
	return nil, posErr(a.pos, "operator %s is not supported", a.name)
}

// Evaluators.

type litExpr struct {
	t valType
	v value
}

func (e *litExpr) typ() valType                  { return e.t }
func (e *litExpr) eval(attrReader) (value, bool) { return e.v, true }

type attrExpr struct {
	slot int
	t    valType
}

func (e *attrExpr) typ() valType                    { return e.t }
func (e *attrExpr) eval(r attrReader) (value, bool) { return r.attr(e.slot) }

type hasExpr struct{ slot int }

func (e *hasExpr) typ() valType { return typeBool }
func (e *hasExpr) eval(r attrReader) (value, bool) {
	_, ok := r.attr(e.slot)
	return value{b: ok}, true
}

type toStringExpr struct{ x expression }

func (e *toStringExpr) typ() valType { return typeString }
func (e *toStringExpr) eval(r attrReader) (value, bool) {
	v, ok := e.x.eval(r)
	if !ok {
		return value{}, false
	}
	return value{s: format(e.x.typ(), v)}, true
}

// format renders a value of type t as a string: decimal ints, true/false.
func format(t valType, v value) string {
	switch t {
	case typeInt:
		return strconv.FormatInt(v.i, 10)
	case typeBool:
		return strconv.FormatBool(v.b)
	}
	return v.s
}

type toIntExpr struct{ x expression }

func (e *toIntExpr) typ() valType { return typeInt }
func (e *toIntExpr) eval(r attrReader) (value, bool) {
	v, ok := e.x.eval(r)
	if !ok || e.x.typ() == typeInt {
		return v, ok
	}
	n, err := strconv.ParseInt(v.s, 10, 64)
	return value{i: n}, err == nil
}

type sizeExpr struct{ x expression }

func (e *sizeExpr) typ() valType { return typeInt }
func (e *sizeExpr) eval(r attrReader) (value, bool) {
	v, ok := e.x.eval(r)
	// CEL's size() of a string counts code points.
	return value{i: int64(utf8.RuneCountInString(v.s))}, ok
}

type notExpr struct{ x expression }

func (e *notExpr) typ() valType { return typeBool }
func (e *notExpr) eval(r attrReader) (value, bool) {
	v, ok := e.x.eval(r)
	return value{b: !v.b}, ok
}

type negExpr struct{ x expression }

func (e *negExpr) typ() valType { return typeInt }
func (e *negExpr) eval(r attrReader) (value, bool) {
	v, ok := e.x.eval(r)
	if !ok || v.i == math.MinInt64 {
		return value{}, false
	}
	return value{i: -v.i}, true
}

type logicExpr struct {
	a, b expression
	and  bool
}

func (e *logicExpr) typ() valType { return typeBool }

// eval follows CEL: the side that decides the result (false for &&, true for ||) wins
// even when the other side errs.
func (e *logicExpr) eval(r attrReader) (value, bool) {
	decisive := !e.and
	va, oka := e.a.eval(r)
	if oka && va.b == decisive {
		return value{b: decisive}, true
	}
	vb, okb := e.b.eval(r)
	if okb && vb.b == decisive {
		return value{b: decisive}, true
	}
	if !oka || !okb {
		return value{}, false
	}
	return value{b: !decisive}, true
}

// evalBoth evaluates the operands of a binary expression; false if either has no value.
func evalBoth(a, b expression, r attrReader) (va, vb value, ok bool) {
	if va, ok = a.eval(r); !ok {
		return value{}, value{}, false
	}
	vb, ok = b.eval(r)
	return va, vb, ok
}

type eqExpr struct {
	a, b expression
	neg  bool
}

func (e *eqExpr) typ() valType { return typeBool }
func (e *eqExpr) eval(r attrReader) (value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return value{}, false
	}
	var eq bool
	switch e.a.typ() {
	case typeString:
		eq = va.s == vb.s
	case typeInt:
		eq = va.i == vb.i
	default:
		eq = va.b == vb.b
	}
	return value{b: eq != e.neg}, true
}

type cmpExpr struct {
	a, b expression
	op   string
}

func (e *cmpExpr) typ() valType { return typeBool }
func (e *cmpExpr) eval(r attrReader) (value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return value{}, false
	}
	c := 0
	if e.a.typ() == typeInt {
		switch {
		case va.i < vb.i:
			c = -1
		case va.i > vb.i:
			c = 1
		}
	} else {
		c = strings.Compare(va.s, vb.s)
	}
	var res bool
	switch e.op {
	case "<":
		res = c < 0
	case "<=":
		res = c <= 0
	case ">":
		res = c > 0
	default:
		res = c >= 0
	}
	return value{b: res}, true
}

type addExpr struct {
	a, b expression
	sub  bool
}

func (e *addExpr) typ() valType { return e.a.typ() }
func (e *addExpr) eval(r attrReader) (value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return value{}, false
	}
	if e.a.typ() == typeString {
		return value{s: va.s + vb.s}, true
	}
	y := vb.i
	if e.sub {
		if y == math.MinInt64 {
			return value{}, false
		}
		y = -y
	}
	s := va.i + y
	// CEL reports int overflow as an error rather than wrapping.
	if (y > 0 && s < va.i) || (y < 0 && s > va.i) {
		return value{}, false
	}
	return value{i: s}, true
}

type condExpr struct{ c, a, b expression }

func (e *condExpr) typ() valType { return e.a.typ() }
func (e *condExpr) eval(r attrReader) (value, bool) {
	c, ok := e.c.eval(r)
	if !ok {
		return value{}, false
	}
	if c.b {
		return e.a.eval(r)
	}
	return e.b.eval(r)
}

type methodExpr struct {
	recv, arg expression
	fn        func(s, t string) bool
}

func (e *methodExpr) typ() valType { return typeBool }
func (e *methodExpr) eval(r attrReader) (value, bool) {
	s, ok := e.recv.eval(r)
	if !ok {
		return value{}, false
	}
	t, ok := e.arg.eval(r)
	if !ok {
		return value{}, false
	}
	return value{b: e.fn(s.s, t.s)}, true
}
