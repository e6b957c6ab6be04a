// Package jsonconf decodes a filter's JSON configuration into Go values, strictly: an
// object member that names no field is an error, field names match exactly (unlike
// encoding/json's; Options.Proto also takes protobuf's lowerCamelCase spelling), and every
// error says where it is (descriptors[0].token_bucket.max_tokens: ...).
//
// It exists so that a filter built for wasip1 carries no encoding/json: measured, that
// package adds 2 to 3 pages of 64 KiB to the minimum linear memory of the mesh's filters
// (6 to a module with nothing but the SDK), which every instance of the filter in every
// worker of every proxy pays, for a configuration decoded once.
//
// Unmarshal fills structs (fields tagged `json:"name"`; untagged fields are never set),
// pointers, slices, maps with string keys, strings, booleans, integers, floats and Raw.
// JSON null leaves a value as it is, except that it sets a pointer, slice, map or Raw to
// nil, as encoding/json does.
package jsonconf

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Raw is a JSON value as it appeared, for a field decoded later or only tested for.
type Raw []byte

// maxDepth bounds the nesting of arrays and objects.
const maxDepth = 1000

var rawType = reflect.TypeFor[Raw]()

// Unmarshal decodes the JSON document data into the value v points to.
func Unmarshal(data []byte, v any) error { return Options{}.Unmarshal(data, v) }

// Options change how a document is read.
type Options struct {
	// Proto reads the document as protobuf's JSON mapping of a message whose fields the
	// tags name (in their proto spelling, lower_snake_case), as the C++ parser of Envoy
	// and Istio does: a member may also be spelt in lowerCamelCase (the field's JSON
	// name), and an integer or a boolean may be a string ("5", "false"). For a filter
	// whose configuration is an Istio message, so that configuration written for Istio
	// (its own charts wrote "debug": "false") reads the same.
	Proto bool
}

// Unmarshal decodes the JSON document data into the value v points to.
func (o Options) Unmarshal(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("jsonconf: Unmarshal needs a non-nil pointer")
	}
	d := &decoder{data: data, proto: o.Proto}
	d.skipSpace()
	if err := d.value(rv.Elem()); err != nil {
		return err
	}
	d.skipSpace()
	if d.pos < len(d.data) {
		return fmt.Errorf("unexpected data after the JSON value at offset %d", d.pos)
	}
	return nil
}

// decoder reads one document; path is where it is, for errors.
type decoder struct {
	data  []byte
	pos   int
	path  []string
	depth int
	proto bool // Options.Proto
}

// fail is an error about the value at the current path.
func (d *decoder) fail(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if len(d.path) == 0 {
		return errors.New(msg)
	}
	return errors.New(strings.TrimPrefix(strings.Join(d.path, ""), ".") + ": " + msg)
}

// syntax is an error about the character at pos.
func (d *decoder) syntax(what string) error {
	if d.pos >= len(d.data) {
		return errors.New("unexpected end of JSON input")
	}
	return fmt.Errorf("invalid character %q at offset %d %s", d.data[d.pos], d.pos, what)
}

func (d *decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// kind names the JSON value starting at pos, for type errors.
func (d *decoder) kind() string {
	switch d.data[d.pos] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// value decodes the value at pos (after any space) into v.
func (d *decoder) value(v reflect.Value) error {
	if d.pos >= len(d.data) {
		return d.syntax("")
	}
	start := d.pos
	if v.Type() == rawType {
		if err := d.skipValue(); err != nil {
			return err
		}
		if string(d.data[start:d.pos]) == "null" {
			v.SetZero()
		} else {
			v.SetBytes(append(Raw(nil), d.data[start:d.pos]...))
		}
		return nil
	}
	if d.data[d.pos] == 'n' {
		if err := d.literal("null"); err != nil {
			return err
		}
		switch v.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map:
			v.SetZero()
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return d.value(v.Elem())
	case reflect.Struct:
		if d.data[d.pos] != '{' {
			return d.wrong("an object")
		}
		return d.object(func(name string) error { return d.field(v, name) })
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return d.fail("cannot decode into %v", v.Type())
		}
		if d.data[d.pos] != '{' {
			return d.wrong("an object")
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		return d.object(func(name string) error { return d.mapEntry(v, name) })
	case reflect.Slice:
		return d.array(v)
	case reflect.String:
		if d.data[d.pos] != '"' {
			return d.wrong("a string")
		}
		s, err := d.str()
		if err != nil {
			return err
		}
		v.SetString(s)
		return nil
	case reflect.Bool:
		switch d.data[d.pos] {
		case 't':
			v.SetBool(true)
			return d.literal("true")
		case 'f':
			v.SetBool(false)
			return d.literal("false")
		case '"':
			if d.proto {
				return d.quoted(func(s string) error {
					if s != "true" && s != "false" {
						return d.fail("want a boolean, not the string %q", s)
					}
					v.SetBool(s == "true")
					return nil
				})
			}
		}
		return d.wrong("a boolean")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return d.number(v)
	}
	return d.fail("cannot decode into %v", v.Type())
}

// wrong is the error for a JSON value of the wrong kind; it leaves pos at the value.
func (d *decoder) wrong(want string) error {
	got := d.kind()
	if err := d.skipValue(); err != nil {
		return err // a syntax error first, as it would be anywhere else
	}
	return d.fail("want %s, not %s", want, got)
}

// literal reads word (true, false or null).
func (d *decoder) literal(word string) error {
	for i := range len(word) {
		if d.pos >= len(d.data) || d.data[d.pos] != word[i] {
			return d.syntax("in literal " + word)
		}
		d.pos++
	}
	return nil
}

// object reads an object at pos, handing each member's name to member with pos at its
// value and the path naming it.
func (d *decoder) object(member func(name string) error) error {
	return d.nested('{', '}', func() error {
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return d.syntax("looking for the start of an object key")
		}
		name, err := d.str()
		if err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return d.syntax("after an object key")
		}
		d.pos++
		d.skipSpace()
		d.path = append(d.path, "."+name)
		err = member(name)
		d.path = d.path[:len(d.path)-1]
		return err
	})
}

// field decodes a struct member into the field tagged with its name.
func (d *decoder) field(v reflect.Value, name string) error {
	if f, ok := fieldByTag(v, name, d.proto); ok {
		return d.value(f)
	}
	if err := d.skipValue(); err != nil {
		return err
	}
	return d.fail("unknown field")
}

// fieldByTag finds the field of struct v tagged name (or, with proto, whose tag's
// lowerCamelCase is name), looking into embedded structs (not pointers to them) without a
// tag, as encoding/json does.
func fieldByTag(v reflect.Value, name string, proto bool) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag != "-" && (tag == name || proto && tag != "" && camel(tag) == name) {
			return v.Field(i), true
		}
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			if fv, ok := fieldByTag(v.Field(i), name, proto); ok {
				return fv, true
			}
		}
	}
	return reflect.Value{}, false
}

// camel is protobuf's JSON name of a field: each underscore dropped and the letter after
// it upper-cased.
func camel(name string) string {
	var b strings.Builder
	upper := false
	for i := range len(name) {
		c := name[i]
		switch {
		case c == '_':
			upper = true
			continue
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		}
		upper = false
		b.WriteByte(c)
	}
	return b.String()
}

// mapEntry decodes a map member into a fresh element and stores it.
func (d *decoder) mapEntry(v reflect.Value, name string) error {
	el := reflect.New(v.Type().Elem()).Elem()
	if err := d.value(el); err != nil {
		return err
	}
	v.SetMapIndex(reflect.ValueOf(name).Convert(v.Type().Key()), el)
	return nil
}

// array decodes an array into a slice, replacing what it held.
func (d *decoder) array(v reflect.Value) error {
	if d.data[d.pos] != '[' {
		return d.wrong("an array")
	}
	out := reflect.MakeSlice(v.Type(), 0, 0)
	err := d.nested('[', ']', func() error {
		d.path = append(d.path, "["+strconv.Itoa(out.Len())+"]")
		el := reflect.New(v.Type().Elem()).Elem()
		err := d.value(el)
		d.path = d.path[:len(d.path)-1]
		out = reflect.Append(out, el)
		return err
	})
	if err == nil {
		v.Set(out)
	}
	return err
}

// nested reads open, the comma-separated items (each read by item, at a non-space
// character) and close.
func (d *decoder) nested(open, close byte, item func() error) error {
	if d.depth++; d.depth > maxDepth {
		return fmt.Errorf("nesting deeper than %d at offset %d", maxDepth, d.pos)
	}
	defer func() { d.depth-- }()
	d.pos++ // open
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == close {
		d.pos++
		return nil
	}
	for {
		d.skipSpace()
		if err := item(); err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax("")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case close:
			d.pos++
			return nil
		default:
			return d.syntax(fmt.Sprintf("after an item of %q", string(open)+string(close)))
		}
	}
}

// skipValue reads a value of any kind without keeping it.
func (d *decoder) skipValue() error {
	if d.pos >= len(d.data) {
		return d.syntax("")
	}
	switch d.data[d.pos] {
	case '{':
		return d.object(func(string) error { return d.skipValue() })
	case '[':
		return d.nested('[', ']', d.skipValue)
	case '"':
		_, err := d.str()
		return err
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	}
	_, err := d.numberText()
	return err
}
