package route

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// stringMatch is a compiled StringMatcher.
type stringMatch struct {
	kind       int // 0 exact, 1 prefix, 2 suffix, 3 contains, 4 regex
	value      string
	re         *regexp.Regexp
	ignoreCase bool
}

func compileString(m *matcherv3.StringMatcher) (*stringMatch, error) {
	if m == nil {
		return nil, nil
	}
	sm := &stringMatch{ignoreCase: m.GetIgnoreCase()}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		sm.kind, sm.value = 0, p.Exact
	case *matcherv3.StringMatcher_Prefix:
		sm.kind, sm.value = 1, p.Prefix
	case *matcherv3.StringMatcher_Suffix:
		sm.kind, sm.value = 2, p.Suffix
	case *matcherv3.StringMatcher_Contains:
		sm.kind, sm.value = 3, p.Contains
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		if err != nil {
			return nil, fmt.Errorf("safe_regex %q: %w", p.SafeRegex.GetRegex(), err)
		}
		sm.kind, sm.re = 4, re
	default:
		return nil, fmt.Errorf("string matcher %T is not supported", p)
	}
	if sm.ignoreCase {
		sm.value = strings.ToLower(sm.value)
	}
	return sm, nil
}

func (m *stringMatch) match(s string) bool {
	if m.kind == 4 {
		return m.re.MatchString(s)
	}
	if m.ignoreCase {
		s = strings.ToLower(s)
	}
	switch m.kind {
	case 0:
		return s == m.value
	case 1:
		return strings.HasPrefix(s, m.value)
	case 2:
		return strings.HasSuffix(s, m.value)
	default:
		return strings.Contains(s, m.value)
	}
}

type pathKind int

const (
	pathPrefix pathKind = iota
	pathExact
	pathRegex
	pathSeparated
)

type headerMatch struct {
	name    string
	present *bool
	str     *stringMatch
	rng     *[2]int64
	invert  bool
	// treatMissingAsEmpty follows Envoy's treat_missing_header_as_empty.
	treatMissingAsEmpty bool
}

type queryMatch struct {
	name    string
	present bool
	str     *stringMatch
}

type matcher struct {
	kind          pathKind
	path          string
	re            *regexp.Regexp
	caseSensitive bool
	headers       []headerMatch
	query         []queryMatch
	grpc          bool
}

func compileMatch(m *routev3.RouteMatch) (matcher, error) {
	out := matcher{caseSensitive: m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()}
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		out.kind, out.path = pathPrefix, p.Prefix
	case *routev3.RouteMatch_Path:
		out.kind, out.path = pathExact, p.Path
	case *routev3.RouteMatch_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		if err != nil {
			return out, fmt.Errorf("match.safe_regex %q: %w", p.SafeRegex.GetRegex(), err)
		}
		out.kind, out.re = pathRegex, re
	case *routev3.RouteMatch_PathSeparatedPrefix:
		out.kind, out.path = pathSeparated, p.PathSeparatedPrefix
	default:
		return out, fmt.Errorf("path specifier %T is not supported", p)
	}
	if !out.caseSensitive {
		out.path = strings.ToLower(out.path)
	}
	for i, h := range m.GetHeaders() {
		hm := headerMatch{name: strings.ToLower(h.GetName()), invert: h.GetInvertMatch(),
			treatMissingAsEmpty: h.GetTreatMissingHeaderAsEmpty()}
		var err error
		switch s := h.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			v := s.PresentMatch
			hm.present = &v
		case *routev3.HeaderMatcher_StringMatch:
			hm.str, err = compileString(s.StringMatch)
		case *routev3.HeaderMatcher_ExactMatch: //nolint:staticcheck // deprecated but still sent
			hm.str = &stringMatch{kind: 0, value: s.ExactMatch}
		case *routev3.HeaderMatcher_PrefixMatch:
			hm.str = &stringMatch{kind: 1, value: s.PrefixMatch}
		case *routev3.HeaderMatcher_SuffixMatch:
			hm.str = &stringMatch{kind: 2, value: s.SuffixMatch}
		case *routev3.HeaderMatcher_ContainsMatch:
			hm.str = &stringMatch{kind: 3, value: s.ContainsMatch}
		case *routev3.HeaderMatcher_SafeRegexMatch:
			hm.str, err = compileString(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: s.SafeRegexMatch}})
		case *routev3.HeaderMatcher_RangeMatch:
			hm.rng = &[2]int64{s.RangeMatch.GetStart(), s.RangeMatch.GetEnd()}
		case nil:
			t := true
			hm.present = &t
		default:
			err = fmt.Errorf("header matcher %T is not supported", s)
		}
		if err != nil {
			return out, fmt.Errorf("match.headers[%d] (%s): %w", i, h.GetName(), err)
		}
		out.headers = append(out.headers, hm)
	}
	for i, q := range m.GetQueryParameters() {
		qm := queryMatch{name: q.GetName()}
		switch s := q.GetQueryParameterMatchSpecifier().(type) {
		case *routev3.QueryParameterMatcher_StringMatch:
			sm, err := compileString(s.StringMatch)
			if err != nil {
				return out, fmt.Errorf("match.query_parameters[%d] (%s): %w", i, q.GetName(), err)
			}
			qm.str = sm
		case *routev3.QueryParameterMatcher_PresentMatch:
			qm.present = s.PresentMatch
		default:
			qm.present = true
		}
		out.query = append(out.query, qm)
	}
	out.grpc = m.GetGrpc() != nil
	if m.GetRuntimeFraction() != nil || m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 {
		return out, fmt.Errorf("match: runtime_fraction, tls_context and dynamic_metadata are not supported")
	}
	return out, nil
}

func (m *matcher) matches(req *http.Request) bool {
	path := req.URL.Path
	if req.URL.RawPath != "" {
		path = req.URL.RawPath
	}
	if !m.caseSensitive {
		path = strings.ToLower(path)
	}
	switch m.kind {
	case pathPrefix:
		if !strings.HasPrefix(path, m.path) {
			return false
		}
	case pathExact:
		if path != m.path {
			return false
		}
	case pathRegex:
		if !m.re.MatchString(path) {
			return false
		}
	case pathSeparated:
		if path != m.path && !strings.HasPrefix(path, m.path+"/") {
			return false
		}
	}
	for _, h := range m.headers {
		if !h.matches(req) {
			return false
		}
	}
	if len(m.query) > 0 {
		q := req.URL.Query()
		for _, qm := range m.query {
			vals, ok := q[qm.name]
			if qm.str != nil {
				if !ok || !qm.str.match(vals[0]) {
					return false
				}
				continue
			}
			if ok != qm.present {
				return false
			}
		}
	}
	if m.grpc && !strings.HasPrefix(req.Header.Get("content-type"), "application/grpc") {
		return false
	}
	return true
}

// headerValue reads a header as Envoy's matcher sees it: pseudo headers from the request
// line, repeated headers joined by ",".
func headerValue(req *http.Request, name string) (string, bool) {
	switch name {
	case ":authority", "host":
		return req.Host, req.Host != ""
	case ":path":
		return req.URL.RequestURI(), true
	case ":method":
		return req.Method, true
	case ":scheme":
		if req.TLS != nil {
			return "https", true
		}
		return "http", true
	}
	vals := req.Header.Values(name)
	if len(vals) == 0 {
		return "", false
	}
	return strings.Join(vals, ","), true
}

func (h *headerMatch) matches(req *http.Request) bool {
	v, ok := headerValue(req, h.name)
	if !ok && h.treatMissingAsEmpty {
		v, ok = "", true
	}
	var res bool
	switch {
	case h.present != nil:
		res = ok == *h.present
		if h.invert {
			return !res
		}
		return res
	case !ok:
		// Envoy: a missing header never matches a value matcher, even when inverted.
		return false
	case h.str != nil:
		res = h.str.match(v)
	case h.rng != nil:
		n, err := strconv.ParseInt(v, 10, 64)
		res = err == nil && n >= h.rng[0] && n < h.rng[1]
	}
	if h.invert {
		return !res
	}
	return res
}

// Vars resolves the %VARIABLE% references in header values (Envoy's custom request and
// response header variables); nil resolves nothing.
type Vars func(name string) (string, bool)

// HeaderOps are the header mutations of one level of the configuration.
type HeaderOps struct {
	reqAdd     []headerAdd
	reqRemove  []string
	respAdd    []headerAdd
	respRemove []string
}

type headerAdd struct {
	key, value string
	action     corev3.HeaderValueOption_HeaderAppendAction
	keepEmpty  bool
}

var varRef = regexp.MustCompile(`%([A-Z_]+)%`)

func compileAdds(opts []*corev3.HeaderValueOption) []headerAdd {
	var out []headerAdd
	for _, o := range opts {
		a := headerAdd{key: o.GetHeader().GetKey(), value: o.GetHeader().GetValue(), action: o.GetAppendAction(),
			keepEmpty: o.GetKeepEmptyValue()}
		if o.GetAppend() != nil { //nolint:staticcheck // deprecated but still sent
			if o.GetAppend().GetValue() {
				a.action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			} else {
				a.action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			}
		}
		out = append(out, a)
	}
	return out
}

func compileHeaders(reqAdd []*corev3.HeaderValueOption, reqRemove []string, respAdd []*corev3.HeaderValueOption, respRemove []string) (HeaderOps, error) {
	for _, o := range append(append([]*corev3.HeaderValueOption(nil), reqAdd...), respAdd...) {
		k := strings.ToLower(o.GetHeader().GetKey())
		if k == "" || (strings.HasPrefix(k, ":") && k != ":authority") {
			return HeaderOps{}, fmt.Errorf("header %q cannot be modified", o.GetHeader().GetKey())
		}
	}
	return HeaderOps{reqAdd: compileAdds(reqAdd), reqRemove: reqRemove, respAdd: compileAdds(respAdd), respRemove: respRemove}, nil
}

func apply(h http.Header, adds []headerAdd, removes []string, vars Vars) {
	for _, r := range removes {
		h.Del(r)
	}
	for _, a := range adds {
		v := a.value
		if strings.Contains(v, "%") && vars != nil {
			v = varRef.ReplaceAllStringFunc(v, func(ref string) string {
				if s, ok := vars(ref[1 : len(ref)-1]); ok {
					return s
				}
				return ref
			})
		}
		if v == "" && !a.keepEmpty {
			continue
		}
		switch a.action {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h.Add(a.key, v)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if h.Get(a.key) == "" {
				h.Set(a.key, v)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h.Set(a.key, v)
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if h.Get(a.key) != "" {
				h.Set(a.key, v)
			}
		}
	}
}

func (o HeaderOps) request(h http.Header, vars Vars)  { apply(h, o.reqAdd, o.reqRemove, vars) }
func (o HeaderOps) response(h http.Header, vars Vars) { apply(h, o.respAdd, o.respRemove, vars) }
