package kubenode

import (
	"sort"
	"strconv"
	"strings"
)

// expand replaces $(VAR) references in s as Kubernetes does in env values, commands and
// args: a defined variable is replaced by its value, an undefined one is left as written,
// "$$" is an escaped "$", and anything else (a lone "$", an unterminated "$(") stays.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
	}
	return b.String()
}

// formatMap writes labels or annotations as the downward API does (Kubernetes'
// fieldpath.FormatMap): key="value" lines sorted by key, values quoted as Go quotes them,
// no newline after the last.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b []byte
	for _, k := range keys {
		if len(b) > 0 {
			b = append(b, '\n')
		}
		b = append(b, k...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, m[k])
	}
	return string(b)
}
