package main

import "unicode/utf8"

// The proxy-wasm ABI defines a metric by name only, so tags travel inside the name the way
// Istio's stats plugin puts them there: every tag as name=.=value;.; in the metric's tag
// order, then the metric's own name:
//
//	reporter=.=destination;.;source_workload=.=productpage-v1;.;...;.;istio_requests_total
//
// The proxy's stats_tags rules, one per tag name, (NAME=\.=(.*?);\.;), cut each tag out of
// the name (the first capture group is removed, the second is the value), which leaves
// istio_requests_total. The regexes are not anchored because Envoy files Wasm metrics
// under its wasmcustom. namespace before extracting tags.
const (
	valueSeparator = "=.="
	fieldSeparator = ";.;"

	// maxTagValueLen bounds a tag value: values come from request headers, and the
	// cardinality cap bounds how many names exist, not how long each is.
	maxTagValueLen = 256
)

// appendTag appends name=.=value;.; with the value made safe for tag extraction.
func appendTag(buf []byte, name, value string) []byte {
	buf = append(buf, name...)
	buf = append(buf, valueSeparator...)
	buf = appendTagValue(buf, value)
	return append(buf, fieldSeparator...)
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
