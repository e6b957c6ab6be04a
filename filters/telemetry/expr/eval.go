package expr

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Evaluators.

type litExpr struct {
	t Type
	v Value
}

func (e *litExpr) typ() Type                 { return e.t }
func (e *litExpr) eval(Reader) (Value, bool) { return e.v, true }

type attrExpr struct {
	slot int
	t    Type
}

func (e *attrExpr) typ() Type                   { return e.t }
func (e *attrExpr) eval(r Reader) (Value, bool) { return r.Attr(e.slot) }

type hasExpr struct{ slot int }

func (e *hasExpr) typ() Type { return Bool }
func (e *hasExpr) eval(r Reader) (Value, bool) {
	_, ok := r.Attr(e.slot)
	return Value{Bool: ok}, true
}

type toStringExpr struct{ x node }

func (e *toStringExpr) typ() Type { return String }
func (e *toStringExpr) eval(r Reader) (Value, bool) {
	v, ok := e.x.eval(r)
	if !ok {
		return Value{}, false
	}
	return Value{Str: Format(e.x.typ(), v)}, true
}

type toIntExpr struct{ x node }

func (e *toIntExpr) typ() Type { return Int }
func (e *toIntExpr) eval(r Reader) (Value, bool) {
	v, ok := e.x.eval(r)
	if !ok || e.x.typ() == Int {
		return v, ok
	}
	n, err := strconv.ParseInt(v.Str, 10, 64)
	return Value{Int: n}, err == nil
}

type sizeExpr struct{ x node }

func (e *sizeExpr) typ() Type { return Int }
func (e *sizeExpr) eval(r Reader) (Value, bool) {
	v, ok := e.x.eval(r)
	// CEL's size() of a string counts code points.
	return Value{Int: int64(utf8.RuneCountInString(v.Str))}, ok
}

type notExpr struct{ x node }

func (e *notExpr) typ() Type { return Bool }
func (e *notExpr) eval(r Reader) (Value, bool) {
	v, ok := e.x.eval(r)
	return Value{Bool: !v.Bool}, ok
}

type negExpr struct{ x node }

func (e *negExpr) typ() Type { return Int }
func (e *negExpr) eval(r Reader) (Value, bool) {
	v, ok := e.x.eval(r)
	if !ok || v.Int == math.MinInt64 {
		return Value{}, false
	}
	return Value{Int: -v.Int}, true
}

type logicExpr struct {
	a, b node
	and  bool
}

func (e *logicExpr) typ() Type { return Bool }

// eval follows CEL: the side that decides the result (false for &&, true for ||) wins
// even when the other side errs.
func (e *logicExpr) eval(r Reader) (Value, bool) {
	decisive := !e.and
	va, oka := e.a.eval(r)
	if oka && va.Bool == decisive {
		return Value{Bool: decisive}, true
	}
	vb, okb := e.b.eval(r)
	if okb && vb.Bool == decisive {
		return Value{Bool: decisive}, true
	}
	if !oka || !okb {
		return Value{}, false
	}
	return Value{Bool: !decisive}, true
}

// evalBoth evaluates the operands of a binary expression; false if either has no value.
func evalBoth(a, b node, r Reader) (va, vb Value, ok bool) {
	if va, ok = a.eval(r); !ok {
		return Value{}, Value{}, false
	}
	vb, ok = b.eval(r)
	return va, vb, ok
}

type eqExpr struct {
	a, b node
	neg  bool
}

func (e *eqExpr) typ() Type { return Bool }
func (e *eqExpr) eval(r Reader) (Value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return Value{}, false
	}
	var eq bool
	switch e.a.typ() {
	case String:
		eq = va.Str == vb.Str
	case Int:
		eq = va.Int == vb.Int
	default:
		eq = va.Bool == vb.Bool
	}
	return Value{Bool: eq != e.neg}, true
}

type cmpExpr struct {
	a, b node
	op   string
}

func (e *cmpExpr) typ() Type { return Bool }
func (e *cmpExpr) eval(r Reader) (Value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return Value{}, false
	}
	c := 0
	if e.a.typ() == Int {
		switch {
		case va.Int < vb.Int:
			c = -1
		case va.Int > vb.Int:
			c = 1
		}
	} else {
		c = strings.Compare(va.Str, vb.Str)
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
	return Value{Bool: res}, true
}

type addExpr struct {
	a, b node
	sub  bool
}

func (e *addExpr) typ() Type { return e.a.typ() }
func (e *addExpr) eval(r Reader) (Value, bool) {
	va, vb, ok := evalBoth(e.a, e.b, r)
	if !ok {
		return Value{}, false
	}
	if e.a.typ() == String {
		return Value{Str: va.Str + vb.Str}, true
	}
	y := vb.Int
	if e.sub {
		if y == math.MinInt64 {
			return Value{}, false
		}
		y = -y
	}
	s := va.Int + y
	// CEL reports int overflow as an error rather than wrapping.
	if (y > 0 && s < va.Int) || (y < 0 && s > va.Int) {
		return Value{}, false
	}
	return Value{Int: s}, true
}

type condExpr struct{ c, a, b node }

func (e *condExpr) typ() Type { return e.a.typ() }
func (e *condExpr) eval(r Reader) (Value, bool) {
	c, ok := e.c.eval(r)
	if !ok {
		return Value{}, false
	}
	if c.Bool {
		return e.a.eval(r)
	}
	return e.b.eval(r)
}

type methodExpr struct {
	recv, arg node
	fn        func(s, t string) bool
}

func (e *methodExpr) typ() Type { return Bool }
func (e *methodExpr) eval(r Reader) (Value, bool) {
	s, ok := e.recv.eval(r)
	if !ok {
		return Value{}, false
	}
	t, ok := e.arg.eval(r)
	if !ok {
		return Value{}, false
	}
	return Value{Bool: e.fn(s.Str, t.Str)}, true
}
