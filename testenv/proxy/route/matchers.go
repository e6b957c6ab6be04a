package route

import (
	"fmt"
	"net/http"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// StringMatcher is a compiled envoy.type.matcher.v3.StringMatcher, for filters that match
// strings the way routes do (CORS origins, ...).
type StringMatcher struct{ m *stringMatch }

// CompileStringMatcher compiles m.
func CompileStringMatcher(m *matcherv3.StringMatcher) (*StringMatcher, error) {
	sm, err := compileString(m)
	if err != nil {
		return nil, err
	}
	if sm == nil {
		return nil, fmt.Errorf("empty string matcher")
	}
	return &StringMatcher{m: sm}, nil
}

// Match reports whether s matches.
func (m *StringMatcher) Match(s string) bool { return m.m.match(s) }

// HeaderMatchers are compiled route HeaderMatchers, all of which must match (the fault
// filter's headers, ...).
type HeaderMatchers struct{ hs []headerMatch }

// CompileHeaderMatchers compiles hs with the route matcher's semantics.
func CompileHeaderMatchers(hs []*routev3.HeaderMatcher) (HeaderMatchers, error) {
	m, err := compileMatch(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}, Headers: hs})
	if err != nil {
		return HeaderMatchers{}, err
	}
	return HeaderMatchers{hs: m.headers}, nil
}

// Match reports whether every matcher matches req.
func (m HeaderMatchers) Match(req *http.Request) bool {
	for i := range m.hs {
		if !m.hs[i].matches(req) {
			return false
		}
	}
	return true
}

// Denominator is what a FractionalPercent's numerator counts out of (100 when unset).
func Denominator(fp *typev3.FractionalPercent) uint64 {
	switch fp.GetDenominator() {
	case typev3.FractionalPercent_TEN_THOUSAND:
		return 10000
	case typev3.FractionalPercent_MILLION:
		return 1000000
	}
	return 100
}
