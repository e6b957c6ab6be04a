package main

import (
	"unicode/utf8"

	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// Tags travel inside the metric name as statsplan.ValueSeparator and FieldSeparator
// describe: every tag as name=.=value;.; in the metric's tag order, then the metric's own
// name. The proxy's stats_tags regexes (NAME=\.=(.*?);\.;) are not anchored because Envoy
// files Wasm metrics under its wasmcustom. namespace before extracting tags.
const (
	// maxTagValueLen bounds a tag value: values come from request headers, and the
	// cardinality cap bounds how many names exist, not how long each is.
	maxTagValueLen = 256
)

// appendTag appends name=.=value;.; with the value made safe for tag extraction.
func appendTag(buf []byte, name, value string) []byte {
	buf = append(buf, name...)
	buf = append(buf, statsplan.ValueSeparator...)
	buf = appendTagValue(buf, value)
	return append(buf, statsplan.FieldSeparator...)
}

// appendTagValue appends v, truncated to maxTagValueLen bytes (on a rune boundary), with
// every '.' that would complete a separator turned into '_'. The extraction regexes stop
// a value at the first ;.; and start a tag at any NAME=.=, so a value must contain
// neither, also counting the '=' written before it and the ';' written after it (a value
// ending in ";." would otherwise end early). Only dots change, and a separator needs a dot
// in the middle, so one pass is enough and other characters pass through untouched.
func appendTagValue(buf []byte, v string) []byte {
	if len(v) > maxTagValueLen {
		n := maxTagValueLen
		for n > 0 && !utf8.RuneStart(v[n]) {
			n--
		}
		v = v[:n]
	}
	start := len(buf)
	buf = append(buf, v...)
	out := buf[start:]
	for i := 0; i < len(v); i++ {
		if v[i] != '.' {
			continue
		}
		prev, next := byte('='), byte(';')
		if i > 0 {
			prev = v[i-1]
		}
		if i+1 < len(v) {
			next = v[i+1]
		}
		if prev == next && (prev == ';' || prev == '=') {
			out[i] = '_'
		}
	}
	return buf
}

// sanitizeTagValue returns v as appendTagValue writes it.
func sanitizeTagValue(v string) string {
	return string(appendTagValue(nil, v))
}
