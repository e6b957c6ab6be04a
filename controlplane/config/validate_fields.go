package config

import (
	"fmt"
	"regexp"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
)

// Field paths and the checks every kind shares (durations, percents, string matches,
// header names, exportTo, selectors).

// path builds field paths such as "http[0].route[1].weight".
type path string

func (p path) f(name string) path {
	if p == "" {
		return path(name)
	}
	return path(string(p) + "." + name)
}

func (p path) i(name string, i int) path { return p.f(fmt.Sprintf("%s[%d]", name, i)) }

func (p path) k(name, key string) path { return p.f(name + "." + key) }

func (p path) idx(i int) path { return path(fmt.Sprintf("%s[%d]", p, i)) }

func (p path) err(format string, args ...any) *FieldError {
	return &FieldError{Field: string(p), Err: fmt.Errorf(format, args...)}
}

func (p path) wrap(err error) *FieldError { return &FieldError{Field: string(p), Err: err} }

func firstErr(errs ...*FieldError) *FieldError {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// unsupported rejects a field wasmesh does not translate.
func (p path) unsupported(why string) *FieldError {
	return p.err("not supported by wasmesh (%s); remove the field", why)
}

func validateDuration(p path, d *durationpb.Duration, min time.Duration) *FieldError {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return p.wrap(err)
	}
	if d.AsDuration() < min {
		return p.err("duration %v is shorter than the minimum %v", d.AsDuration(), min)
	}
	return nil
}

func validatePercent(p path, v *networking.Percent) *FieldError {
	if v == nil {
		return nil
	}
	if v.GetValue() < 0 || v.GetValue() > 100 {
		return p.f("value").err("percentage %v must be in [0, 100]", v.GetValue())
	}
	return nil
}

// validateStringMatch checks an exact/prefix/regex matcher; allowEmpty accepts a matcher with
// no type, which means "present" for headers and query parameters.
func validateStringMatch(p path, m *networking.StringMatch, allowEmpty, allowPrefix bool) *FieldError {
	if m == nil {
		return nil
	}
	switch t := m.GetMatchType().(type) {
	case nil:
		if !allowEmpty {
			return p.err("one of exact, prefix or regex is required")
		}
	case *networking.StringMatch_Exact:
	case *networking.StringMatch_Prefix:
		if !allowPrefix {
			return p.f("prefix").err("prefix matching is not supported here (Istio supports exact and regex)")
		}
	case *networking.StringMatch_Regex:
		if t.Regex == "" {
			return p.f("regex").err("empty regex")
		}
		if t.Regex != "*" { // "*" is Istio's spelling of "present"
			if _, err := regexp.Compile(t.Regex); err != nil {
				return p.f("regex").err("%q is not an RE2 regular expression: %v", t.Regex, err)
			}
		}
	}
	return nil
}

var headerName = regexp.MustCompile(`^:?[!#$%&'*+\-.^_` + "`" + `|~0-9a-zA-Z]+$`)

func validateHeaderName(p path, name string) *FieldError {
	if name == "" {
		return p.err("empty header name")
	}
	if !headerName.MatchString(name) {
		return p.err("%q is not a valid header name", name)
	}
	return nil
}

// validateExportTo accepts ".", "*", "~" (alone) and namespace names.
func validateExportTo(p path, list []string) *FieldError {
	seen := map[string]bool{}
	for i, v := range list {
		switch v {
		case ".", "*":
		case "~":
			if len(list) > 1 {
				return p.idx(i).err(`"~" (export to no namespace) cannot be combined with other entries`)
			}
		default:
			if err := validateDNSLabel(v, 63); err != nil {
				return p.idx(i).wrap(err)
			}
		}
		if seen[v] {
			return p.idx(i).err("duplicate %q", v)
		}
		seen[v] = true
	}
	return nil
}

func validateSelectorLabels(p path, labels map[string]string, required bool) *FieldError {
	if required && len(labels) == 0 {
		return p.err("at least one label is required")
	}
	return validateLabels(string(p), labels)
}
