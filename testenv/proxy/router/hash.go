package router

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/cespare/xxhash/v2"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// hashPolicy is a route's compiled hash_policy list (Envoy's HashPolicyImpl): every policy
// that yields a value is xxHash64-ed and folded into the request hash (the previous value
// rotated left by one, XORed with the new one); a terminal policy that produced a hash
// ends the list.
type hashPolicy struct {
	methods []hashMethod
}

type hashMethod struct {
	terminal bool
	header   string
	rewrite  *regexp.Regexp
	subst    string
	cookie   *routev3.RouteAction_HashPolicy_Cookie
	sourceIP bool
	query    string
}

func compileHashPolicy(ps []*routev3.RouteAction_HashPolicy) (*hashPolicy, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	hp := &hashPolicy{}
	for i, p := range ps {
		m := hashMethod{terminal: p.GetTerminal()}
		switch s := p.GetPolicySpecifier().(type) {
		case *routev3.RouteAction_HashPolicy_Header_:
			m.header = strings.ToLower(s.Header.GetHeaderName())
			if rr := s.Header.GetRegexRewrite(); rr != nil {
				re, err := regexp.Compile(rr.GetPattern().GetRegex())
				if err != nil {
					return nil, fmt.Errorf("hash_policy[%d].header.regex_rewrite: %w", i, err)
				}
				m.rewrite, m.subst = re, envoySubst(rr.GetSubstitution())
			}
		case *routev3.RouteAction_HashPolicy_Cookie_:
			m.cookie = s.Cookie
		case *routev3.RouteAction_HashPolicy_ConnectionProperties_:
			if !s.ConnectionProperties.GetSourceIp() {
				continue
			}
			m.sourceIP = true
		case *routev3.RouteAction_HashPolicy_QueryParameter_:
			m.query = s.QueryParameter.GetName()
		default:
			return nil, fmt.Errorf("hash_policy[%d]: %T is not supported", i, s)
		}
		hp.methods = append(hp.methods, m)
	}
	return hp, nil
}

var backRef = regexp.MustCompile(`\\(\d)`)

func envoySubst(s string) string { return backRef.ReplaceAllString(s, "$${$1}") }

// hashInput is what the hash policies read.
type hashInput struct {
	req        *http.Request
	peer       string // downstream remote address
	local      string // downstream local address
	setCookies []string
}

// generate computes the request hash; ok is false when no policy produced a value.
func (hp *hashPolicy) generate(in *hashInput) (uint64, bool) {
	var hash uint64
	have := false
	for _, m := range hp.methods {
		v, ok := m.evaluate(in)
		if ok {
			old := uint64(0)
			if have {
				old = hash<<1 | hash>>63
			}
			hash, have = old^v, true
		}
		if m.terminal && have {
			break
		}
	}
	return hash, have
}

func (m *hashMethod) evaluate(in *hashInput) (uint64, bool) {
	switch {
	case m.header != "":
		vals := in.req.Header.Values(m.header)
		if m.header == ":authority" || m.header == "host" {
			vals = []string{in.req.Host}
		}
		if len(vals) == 0 {
			return 0, false
		}
		vals = append([]string(nil), vals...)
		if m.rewrite != nil {
			for i, v := range vals {
				vals[i] = m.rewrite.ReplaceAllString(v, m.subst)
			}
		}
		// Envoy sorts multiple values so their order does not matter, and chains the
		// xxHash64 of each through the seed.
		sort.Strings(vals)
		var h uint64
		for _, v := range vals {
			d := xxhash.NewWithSeed(h)
			_, _ = d.WriteString(v)
			h = d.Sum64()
		}
		return h, true
	case m.cookie != nil:
		if c, err := in.req.Cookie(m.cookie.GetName()); err == nil && c.Value != "" {
			return xxhash.Sum64String(c.Value), true
		}
		if m.cookie.GetTtl() == nil {
			return 0, false
		}
		// Envoy generates the cookie from the connection's addresses, so that concurrent
		// requests of one connection get the same value, and sets it on the response.
		v := fmt.Sprintf("%016x", xxhash.Sum64String(in.peer+in.local))
		in.setCookies = append(in.setCookies, setCookie(m.cookie, v))
		return xxhash.Sum64String(v), true
	case m.sourceIP:
		host, _, err := net.SplitHostPort(in.peer)
		if err != nil || host == "" {
			return 0, false
		}
		return xxhash.Sum64String(host), true
	case m.query != "":
		vals, ok := in.req.URL.Query()[m.query]
		if !ok || len(vals) == 0 {
			return 0, false
		}
		return xxhash.Sum64String(vals[0]), true
	}
	return 0, false
}

// setCookie renders Envoy's generated hash cookie.
func setCookie(c *routev3.RouteAction_HashPolicy_Cookie, value string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s=\"%s\"", c.GetName(), value)
	if ttl := c.GetTtl().GetSeconds(); ttl > 0 {
		fmt.Fprintf(&b, "; Max-Age=%d", ttl)
	}
	if c.GetPath() != "" {
		fmt.Fprintf(&b, "; Path=%s", c.GetPath())
	}
	for _, a := range c.GetAttributes() {
		if a.GetValue() == "" {
			fmt.Fprintf(&b, "; %s", a.GetName())
		} else {
			fmt.Fprintf(&b, "; %s=%s", a.GetName(), a.GetValue())
		}
	}
	b.WriteString("; HttpOnly")
	return b.String()
}
