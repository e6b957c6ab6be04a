package expr

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

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
	lit     Value
	litType Type
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
			return p.parsePostfix(&ast{kind: astLit, pos: t.pos, lit: Value{Int: v}, litType: Int})
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
		return &ast{kind: astLit, pos: t.pos, lit: Value{Int: n}, litType: Int}, nil
	case tokString:
		return &ast{kind: astLit, pos: t.pos, lit: Value{Str: t.str}, litType: String}, nil
	case tokIdent:
		switch t.text {
		case "true", "false":
			return &ast{kind: astLit, pos: t.pos, lit: Value{Bool: t.text == "true"}, litType: Bool}, nil
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
