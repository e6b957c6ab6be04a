package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Istio's YAML writes durations the Go way ("50ms", "1.5s", "5m", "24h"); protobuf's JSON
// mapping accepts only seconds ("0.050s"). normalizeDurations rewrites every string in a
// google.protobuf.Duration field of the spec into the protobuf form before decoding, so both
// spellings work; a string that is neither is left for protojson to reject.
func normalizeDurations(js []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		return nil, err
	}
	if !rewriteDurations(v, md) {
		return js, nil
	}
	return json.Marshal(v)
}

func rewriteDurations(v any, md protoreflect.MessageDescriptor) bool {
	obj, ok := v.(map[string]any)
	if !ok {
		return false
	}
	changed := false
	fields := md.Fields()
	for k, val := range obj {
		fd := fields.ByJSONName(k)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(k))
		}
		if fd == nil || fd.Kind() != protoreflect.MessageKind {
			continue
		}
		each := func(x any, set func(any)) {
			if fd.Message().FullName() == "google.protobuf.Duration" {
				if s, ok := x.(string); ok {
					if d, ok := goDuration(s); ok {
						set(d)
						changed = true
					}
				}
				return
			}
			if rewriteDurations(x, fd.Message()) {
				changed = true
			}
		}
		switch {
		case fd.IsMap():
			if m, ok := val.(map[string]any); ok && fd.MapValue().Kind() == protoreflect.MessageKind {
				for _, mv := range m {
					if rewriteDurations(mv, fd.MapValue().Message()) {
						changed = true
					}
				}
			}
		case fd.IsList():
			if list, ok := val.([]any); ok {
				for i := range list {
					each(list[i], func(n any) { list[i] = n })
				}
			}
		default:
			each(val, func(n any) { obj[k] = n })
		}
	}
	return changed
}

// goDuration converts a Go duration string into protobuf's JSON form; strings already in
// that form (a number of seconds with an "s" suffix) are left as they are.
func goDuration(s string) (string, bool) {
	if strings.HasSuffix(s, "s") {
		if _, err := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64); err == nil {
			return "", false
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return "", false
	}
	sec, ns := int64(d/time.Second), int64(d%time.Second)
	sign := ""
	if d < 0 {
		sign, sec, ns = "-", -sec, -ns
	}
	out := sign + strconv.FormatInt(sec, 10)
	if ns != 0 {
		out += strings.TrimRight(fmt.Sprintf(".%09d", ns), "0")
	}
	return out + "s", true
}
