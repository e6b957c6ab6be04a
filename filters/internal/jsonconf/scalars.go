package jsonconf

import (
	"reflect"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// str reads a string at pos (its opening quote) and returns it unescaped. Invalid UTF-8
// becomes U+FFFD, as encoding/json has it.
func (d *decoder) str() (string, error) {
	d.pos++ // "
	start := d.pos
	for d.pos < len(d.data) { // the common case: nothing to unescape
		c := d.data[d.pos]
		if c == '"' {
			d.pos++
			return string(d.data[start : d.pos-1]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		d.pos++
	}
	b := append([]byte(nil), d.data[start:d.pos]...)
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return string(b), nil
		case c < 0x20:
			return "", d.syntax("in a string (control characters must be escaped)")
		case c == '\\':
			var err error
			if b, err = d.escape(b); err != nil {
				return "", err
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			d.pos++
		default:
			r, size := utf8.DecodeRune(d.data[d.pos:])
			b = utf8.AppendRune(b, r) // RuneError for an invalid sequence
			d.pos += size
		}
	}
	return "", d.syntax("")
}

// escape reads the escape sequence at pos and appends what it stands for to b.
func (d *decoder) escape(b []byte) ([]byte, error) {
	d.pos++ // backslash
	if d.pos >= len(d.data) {
		return nil, d.syntax("")
	}
	c := d.data[d.pos]
	d.pos++
	switch c {
	case '"', '\\', '/':
		return append(b, c), nil
	case 'b':
		return append(b, '\b'), nil
	case 'f':
		return append(b, '\f'), nil
	case 'n':
		return append(b, '\n'), nil
	case 'r':
		return append(b, '\r'), nil
	case 't':
		return append(b, '\t'), nil
	case 'u':
	default:
		d.pos--
		return nil, d.syntax("in a string escape")
	}
	r, err := d.hex4()
	if err != nil {
		return nil, err
	}
	if utf16.IsSurrogate(r) {
		// A high surrogate followed by \u and a low one is one character; anything else
		// is U+FFFD, as encoding/json has it.
		save := d.pos
		if d.pos+1 < len(d.data) && d.data[d.pos] == '\\' && d.data[d.pos+1] == 'u' {
			d.pos += 2
			r2, err := d.hex4()
			if err != nil {
				return nil, err
			}
			if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
				return utf8.AppendRune(b, pair), nil
			}
		}
		d.pos = save
		r = utf8.RuneError
	}
	return utf8.AppendRune(b, r), nil
}

// hex4 reads the four hex digits of a \u escape.
func (d *decoder) hex4() (rune, error) {
	var r rune
	for range 4 {
		if d.pos >= len(d.data) {
			return 0, d.syntax("")
		}
		c := d.data[d.pos]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, d.syntax("in a \\u escape")
		}
		r = r<<4 | rune(c)
		d.pos++
	}
	return r, nil
}

// numberText reads a number at pos: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *decoder) numberText() (string, error) {
	start := d.pos
	digits := func() bool { // whether there was one
		from := d.pos
		for d.pos < len(d.data) && '0' <= d.data[d.pos] && d.data[d.pos] <= '9' {
			d.pos++
		}
		return d.pos > from
	}
	next := func(set string) bool {
		if d.pos < len(d.data) {
			for i := range len(set) {
				if d.data[d.pos] == set[i] {
					d.pos++
					return true
				}
			}
		}
		return false
	}
	next("-")
	if next("0") {
		// no more digits before the fraction
	} else if !digits() {
		return "", d.syntax("looking for the start of a value")
	}
	if next(".") && !digits() {
		return "", d.syntax("after a decimal point")
	}
	if next("eE") {
		next("+-")
		if !digits() {
			return "", d.syntax("in an exponent")
		}
	}
	return string(d.data[start:d.pos]), nil
}

// number decodes a number into an integer or float v.
func (d *decoder) number(v reflect.Value) error {
	if d.proto && d.data[d.pos] == '"' && v.Kind() != reflect.Float32 && v.Kind() != reflect.Float64 {
		// protobuf's JSON mapping writes 64-bit integers as strings, and reads any
		// integer from one.
		return d.quoted(func(s string) error { return d.setNumber(v, s) })
	}
	if c := d.data[d.pos]; c != '-' && (c < '0' || c > '9') {
		return d.wrong("a number")
	}
	text, err := d.numberText()
	if err != nil {
		return err
	}
	return d.setNumber(v, text)
}

// quoted reads a string and hands it to set.
func (d *decoder) quoted(set func(string) error) error {
	s, err := d.str()
	if err != nil {
		return err
	}
	return set(s)
}

// setNumber stores the number text in v.
func (d *decoder) setNumber(v reflect.Value, text string) error {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(text, v.Type().Bits())
		if err != nil {
			return d.fail("number %s does not fit %v", text, v.Type())
		}
		v.SetFloat(f)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(text, 10, v.Type().Bits())
		if err != nil {
			return d.fail("number %s is not a whole number that fits %v", text, v.Type())
		}
		v.SetUint(n)
	default:
		n, err := strconv.ParseInt(text, 10, v.Type().Bits())
		if err != nil {
			return d.fail("number %s is not a whole number that fits %v", text, v.Type())
		}
		v.SetInt(n)
	}
	return nil
}
