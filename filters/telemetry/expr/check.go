package expr

import (
	"strings"
)

// Type checker: turns the syntax tree into evaluators.

type checker struct {
	resolve Resolver
}

func (c *checker) check(a *ast) (node, error) {
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
			if x.typ() != Bool {
				return nil, posErr(a.pos, "operator ! needs a bool, not %s", x.typ())
			}
			return &notExpr{x: x}, nil
		}
		if x.typ() != Int {
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
		if cond.typ() != Bool {
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
func (c *checker) attribute(a *ast) (int, Type, error) {
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
		if key.kind != astLit || key.litType != String {
			return nil, posErr(a.pos, "only string literal keys are supported in [...]")
		}
		return append(p, key.lit.Str), nil
	}
	return nil, posErr(a.pos, "only attributes can be selected from or indexed")
}

func rootPos(a *ast) int {
	for a.recv != nil {
		a = a.recv
	}
	return a.pos
}

func (c *checker) call(a *ast) (node, error) {
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
		if x.typ() == Bool {
			return nil, posErr(a.pos, "int() of a bool is not supported")
		}
		return &toIntExpr{x: x}, nil
	case "size":
		if x.typ() != String {
			return nil, posErr(a.pos, "size() needs a string, not %s", x.typ())
		}
		return &sizeExpr{x: x}, nil
	}
	return nil, posErr(a.pos, "unsupported function %s()", a.name)
}

func (c *checker) method(a *ast) (node, error) {
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
	if recv.typ() != String || arg.typ() != String {
		return nil, posErr(a.pos, "%s() works on strings, not %s and %s", a.name, recv.typ(), arg.typ())
	}
	return &methodExpr{recv: recv, arg: arg, fn: fn}, nil
}

func (c *checker) binary(a *ast) (node, error) {
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
		if tx != Bool || ty != Bool {
			return nil, posErr(a.pos, "operator %s needs bools, not %s and %s", a.name, tx, ty)
		}
		return &logicExpr{a: x, b: y, and: a.name == "&&"}, nil
	case "==", "!=":
		if tx != ty {
			return nil, posErr(a.pos, "cannot compare %s %s %s", tx, a.name, ty)
		}
		return &eqExpr{a: x, b: y, neg: a.name == "!="}, nil
	case "<", "<=", ">", ">=":
		if tx != ty || tx == Bool {
			return nil, posErr(a.pos, "operator %s needs two ints or two strings, not %s and %s", a.name, tx, ty)
		}
		return &cmpExpr{a: x, b: y, op: a.name}, nil
	case "+":
		if tx != ty || tx == Bool {
			return nil, posErr(a.pos, "operator + needs two strings or two ints, not %s and %s", tx, ty)
		}
		return &addExpr{a: x, b: y}, nil
	case "-":
		if tx != Int || ty != Int {
			return nil, posErr(a.pos, "operator - needs ints, not %s and %s", tx, ty)
		}
		return &addExpr{a: x, b: y, sub: true}, nil
	}
	return nil, posErr(a.pos, "operator %s is not supported", a.name)
}
