package rbac

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// compileJSON compiles an RBAC written as Envoy's JSON.
func compileJSON(t *testing.T, js string) *Engine {
	t.Helper()
	r := &rbacv3.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(js), r))
	e, err := Compile(r)
	require.NoError(t, err)
	return e
}

func policyJSON(action, perm, princ string) string {
	return `{"action":"` + action + `","policies":{"p":{"permissions":[` + perm + `],"principals":[` + princ + `]}}}`
}

func request(method, target, host string, hdr map[string]string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.Host = host
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	return r
}

func tlsWith(uris, dns []string, subject string) *streaminfo.TLS {
	return &streaminfo.TLS{PeerURISANs: uris, PeerDNSSANs: dns, PeerSubject: subject, SNI: "svc.local"}
}

func input(r *http.Request, remote string, local string, t *streaminfo.TLS) *Input {
	in := &Input{Request: r, DirectRemote: netip.MustParseAddr(remote), TLS: t, Local: netip.MustParseAddrPort(local)}
	in.Remote = in.DirectRemote
	return in
}

func TestEngineMatchers(t *testing.T) {
	get := request("GET", "/api/v1/items?x=1", "example.com:8080", map[string]string{"x-user": "alice"})
	mtls := tlsWith([]string{"spiffe://cluster.local/ns/a/sa/web", "spiffe://other/x"}, []string{"web.a"}, "CN=web")
	base := input(get, "10.1.2.3", "10.9.0.1:8080", mtls)
	plain := input(get, "10.1.2.3", "10.9.0.1:8080", nil)
	conn := input(nil, "10.1.2.3", "10.9.0.1:8080", mtls)
	cases := []struct {
		name        string
		perm, princ string
		in          *Input
		want        bool
	}{
		{"any", `{"any":true}`, `{"any":true}`, base, true},
		{"permission no match", `{"destinationPort":9090}`, `{"any":true}`, base, false},
		{"destination port", `{"destinationPort":8080}`, `{"any":true}`, base, true},
		{"port range end excluded", `{"destinationPortRange":{"start":8000,"end":8080}}`, `{"any":true}`, base, false},
		{"port range", `{"destinationPortRange":{"start":8080,"end":8081}}`, `{"any":true}`, base, true},
		{"destination ip", `{"destinationIp":{"addressPrefix":"10.9.0.0","prefixLen":16}}`, `{"any":true}`, base, true},
		{"destination ip other", `{"destinationIp":{"addressPrefix":"10.8.0.0","prefixLen":16}}`, `{"any":true}`, base, false},
		{"method header", `{"header":{"name":":method","stringMatch":{"exact":"GET"}}}`, `{"any":true}`, base, true},
		{"authority with port", `{"header":{"name":":authority","stringMatch":{"exact":"EXAMPLE.com:8080","ignoreCase":true}}}`, `{"any":true}`, base, true},
		{"authority without port does not match host:port", `{"header":{"name":":authority","stringMatch":{"exact":"example.com","ignoreCase":true}}}`, `{"any":true}`, base, false},
		{"url_path ignores query", `{"urlPath":{"path":{"exact":"/api/v1/items"}}}`, `{"any":true}`, base, true},
		{"url_path prefix", `{"urlPath":{"path":{"prefix":"/api/"}}}`, `{"any":true}`, base, true},
		{"url_path suffix", `{"urlPath":{"path":{"suffix":"/other"}}}`, `{"any":true}`, base, false},
		{"url_path on a connection", `{"urlPath":{"path":{"prefix":"/"}}}`, `{"any":true}`, conn, false},
		{"header on a connection", `{"header":{"name":":method","presentMatch":true}}`, `{"any":true}`, conn, false},
		{"and all", `{"andRules":{"rules":[{"destinationPort":8080},{"header":{"name":":method","stringMatch":{"exact":"GET"}}}]}}`, `{"any":true}`, base, true},
		{"and one fails", `{"andRules":{"rules":[{"destinationPort":8080},{"header":{"name":":method","stringMatch":{"exact":"POST"}}}]}}`, `{"any":true}`, base, false},
		{"or one", `{"orRules":{"rules":[{"destinationPort":1},{"destinationPort":8080}]}}`, `{"any":true}`, base, true},
		{"not", `{"notRule":{"destinationPort":8080}}`, `{"any":true}`, base, false},
		{"sni", `{"requestedServerName":{"suffix":".local"}}`, `{"any":true}`, base, true},
		{"sni empty without tls", `{"requestedServerName":{"exact":""}}`, `{"any":true}`, plain, true},
		{"principal exact uri san", `{"any":true}`, `{"authenticated":{"principalName":{"exact":"spiffe://cluster.local/ns/a/sa/web"}}}`, base, true},
		{"principal second uri san", `{"any":true}`, `{"authenticated":{"principalName":{"exact":"spiffe://other/x"}}}`, base, true},
		{"principal dns san", `{"any":true}`, `{"authenticated":{"principalName":{"exact":"web.a"}}}`, base, true},
		{"principal subject", `{"any":true}`, `{"authenticated":{"principalName":{"exact":"CN=web"}}}`, base, true},
		{"principal regex", `{"any":true}`, `{"authenticated":{"principalName":{"safeRegex":{"regex":".*/ns/a/.*"}}}}`, base, true},
		{"principal regex is anchored", `{"any":true}`, `{"authenticated":{"principalName":{"safeRegex":{"regex":"/ns/a/"}}}}`, base, false},
		{"principal plaintext", `{"any":true}`, `{"authenticated":{"principalName":{"safeRegex":{"regex":".*"}}}}`, plain, false},
		{"authenticated any", `{"any":true}`, `{"authenticated":{}}`, base, true},
		{"authenticated any plaintext", `{"any":true}`, `{"authenticated":{}}`, plain, false},
		{"direct remote ip", `{"any":true}`, `{"directRemoteIp":{"addressPrefix":"10.1.0.0","prefixLen":16}}`, base, true},
		{"direct remote ip host", `{"any":true}`, `{"directRemoteIp":{"addressPrefix":"10.1.2.4","prefixLen":32}}`, base, false},
		{"source ip", `{"any":true}`, `{"sourceIp":{"addressPrefix":"10.1.2.3","prefixLen":32}}`, base, true},
		{"remote ip", `{"any":true}`, `{"remoteIp":{"addressPrefix":"10.0.0.0","prefixLen":8}}`, base, true},
		{"ipv6 prefix on ipv4", `{"any":true}`, `{"directRemoteIp":{"addressPrefix":"::","prefixLen":0}}`, base, false},
		{"principal header", `{"any":true}`, `{"header":{"name":"x-user","stringMatch":{"prefix":"ali"}}}`, base, true},
		{"principal header missing, even inverted", `{"any":true}`, `{"header":{"name":"x-group","stringMatch":{"suffix":"x"},"invertMatch":true}}`, base, false},
		{"principal header absent", `{"any":true}`, `{"header":{"name":"x-group","presentMatch":false}}`, base, true},
		{"principal header inverted", `{"any":true}`, `{"header":{"name":"x-user","stringMatch":{"exact":"alice"},"invertMatch":true}}`, base, false},
		{"principal header contains", `{"any":true}`, `{"header":{"name":"x-user","stringMatch":{"contains":"lic"}}}`, base, true},
		{"header legacy exact", `{"header":{"name":"x-user","exactMatch":"alice"}}`, `{"any":true}`, base, true},
		{"header legacy regex", `{"header":{"name":"x-user","safeRegexMatch":{"regex":"a.*e"}}}`, `{"any":true}`, base, true},
		{"header range", `{"header":{"name":"x-n","rangeMatch":{"start":1,"end":10}}}`, `{"any":true}`, input(request("GET", "/", "h", map[string]string{"x-n": "9"}), "10.1.2.3", "10.9.0.1:8080", nil), true},
		{"header range end excluded", `{"header":{"name":"x-n","rangeMatch":{"start":1,"end":9}}}`, `{"any":true}`, input(request("GET", "/", "h", map[string]string{"x-n": "9"}), "10.1.2.3", "10.9.0.1:8080", nil), false},
		{"header missing as empty", `{"header":{"name":"x-none","stringMatch":{"exact":""},"treatMissingHeaderAsEmpty":true}}`, `{"any":true}`, base, true},
		{"principal url path", `{"any":true}`, `{"urlPath":{"path":{"prefix":"/api"}}}`, base, true},
		{"and ids", `{"any":true}`, `{"andIds":{"ids":[{"authenticated":{}},{"directRemoteIp":{"addressPrefix":"10.1.2.3","prefixLen":32}}]}}`, base, true},
		{"and ids one fails", `{"any":true}`, `{"andIds":{"ids":[{"authenticated":{}},{"directRemoteIp":{"addressPrefix":"10.1.2.3","prefixLen":32}}]}}`, plain, false},
		{"or ids", `{"any":true}`, `{"orIds":{"ids":[{"authenticated":{}},{"directRemoteIp":{"addressPrefix":"10.1.2.3","prefixLen":32}}]}}`, plain, true},
		{"not id", `{"any":true}`, `{"notId":{"authenticated":{}}}`, plain, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := compileJSON(t, policyJSON("ALLOW", tc.perm, tc.princ))
			d := e.Evaluate(tc.in)
			assert.Equal(t, tc.want, d.Matched)
			assert.Equal(t, tc.want, d.Allowed)
		})
	}
}

func TestEngineRemoteIPFromForwardedFor(t *testing.T) {
	r := request("GET", "/", "h", map[string]string{"x-forwarded-for": "192.0.2.1, 203.0.113.7"})
	in := streamInput(&hcm.Stream{Request: r, Info: &streaminfo.Info{DownstreamPeer: "10.0.0.5:4000", DownstreamLocal: "[::ffff:10.0.0.9]:80"}})
	assert.Equal(t, "203.0.113.7", in.Remote.String())
	assert.Equal(t, "10.0.0.5", in.DirectRemote.String())
	assert.Equal(t, "10.0.0.9:80", in.Local.String(), "a v4-mapped local address is matched as IPv4")
}

func TestEngineActions(t *testing.T) {
	in := input(request("GET", "/", "h", nil), "10.0.0.1", "10.0.0.2:80", nil)
	const two = `{"action":"%s","policies":{
	  "b-second":{"permissions":[{"any":true}],"principals":[{"any":true}]},
	  "a-first":{"permissions":[{"any":true}],"principals":[{"any":true}]},
	  "c-never":{"permissions":[{"notRule":{"any":true}}],"principals":[{"notId":{"any":true}}]}}}`
	for _, tc := range []struct {
		action      string
		wantAllowed bool
	}{{"ALLOW", true}, {"DENY", false}, {"LOG", true}} {
		e := compileJSON(t, fmt.Sprintf(two, tc.action))
		d := e.Evaluate(in)
		assert.Equal(t, tc.wantAllowed, d.Allowed, tc.action)
		assert.True(t, d.Matched, tc.action)
		assert.Equal(t, "a-first", d.PolicyID, "policies are tried in name order")
	}
	never := `{"action":"%s","policies":{"c-never":{"permissions":[{"notRule":{"any":true}}],"principals":[{"notId":{"any":true}}]}}}`
	for _, tc := range []struct {
		action      string
		wantAllowed bool
	}{{"ALLOW", false}, {"DENY", true}, {"LOG", true}} {
		d := compileJSON(t, fmt.Sprintf(never, tc.action)).Evaluate(in)
		assert.Equal(t, tc.wantAllowed, d.Allowed, tc.action)
		assert.False(t, d.Matched)
		assert.Equal(t, "", d.PolicyID)
	}
	// No policies: ALLOW allows nothing, DENY denies nothing.
	assert.False(t, compileJSON(t, `{"action":"ALLOW"}`).Evaluate(in).Allowed)
	assert.True(t, compileJSON(t, `{"action":"DENY"}`).Evaluate(in).Allowed)
	// A policy needs a permission and a principal.
	assert.False(t, compileJSON(t, `{"policies":{"p":{"permissions":[{"any":true}],"principals":[{"notId":{"any":true}}]}}}`).Evaluate(in).Matched)
	assert.False(t, compileJSON(t, `{"policies":{"p":{"permissions":[{"notRule":{"any":true}}],"principals":[{"any":true}]}}}`).Evaluate(in).Matched)
}

func TestEngineRefusesWhatItCannotEvaluate(t *testing.T) {
	for js, msg := range map[string]string{
		`{"policies":{"p":{"permissions":[{"metadata":{"filter":"f","path":[{"key":"k"}],"value":{"presentMatch":true}}}],"principals":[{"any":true}]}}}`: "policies[p].permissions[0]: permission *rbacv3.Permission_Metadata is not supported",
		`{"policies":{"p":{"permissions":[{"any":true}],"principals":[{"filterState":{"key":"k","stringMatch":{"exact":"x"}}}]}}}`:                        "policies[p].principals[0]: principal *rbacv3.Principal_FilterState is not supported",
		`{"policies":{"p":{"permissions":[{"any":true}],"principals":[{"directRemoteIp":{"addressPrefix":"nope","prefixLen":8}}]}}}`:                      `direct_remote_ip: address_prefix "nope" is not an IP address`,
		`{"policies":{"p":{"permissions":[{"any":true}],"principals":[{"directRemoteIp":{"addressPrefix":"10.0.0.0","prefixLen":33}}]}}}`:                 "prefix_len 33 is longer",
		`{"policies":{"p":{"permissions":[{"urlPath":{"path":{"safeRegex":{"regex":"("}}}}],"principals":[{"any":true}]}}}`:                               "url_path: safe_regex",
		`{"policies":{"p":{"permissions":[{"any":true}],"principals":[{"any":true}],"condition":{"constExpr":{"boolValue":true}}}}}`:                      "policies[p]: CEL conditions are not supported",
	} {
		r := &rbacv3.RBAC{}
		require.NoError(t, protojson.Unmarshal([]byte(js), r), js)
		_, err := Compile(r)
		require.Error(t, err, js)
		assert.Contains(t, err.Error(), msg)
	}
	// Envoy's own validation: a policy without principals.
	_, err := Compile(&rbacv3.RBAC{Policies: map[string]*rbacv3.Policy{"p": {Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}}}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Principals")
}

// BenchmarkEvaluate is one decision of an ALLOW filter as Istio generates it for a rule
// with principals, hosts, methods and paths, for a request that matches its last policy.
func BenchmarkEvaluate(b *testing.B) {
	var policies []string
	for i := range 10 {
		policies = append(policies, fmt.Sprintf(`"ns[demo]-policy[p]-rule[%d]": {
		  "permissions": [{"andRules": {"rules": [
		    {"orRules": {"rules": [{"header": {"name": ":authority", "stringMatch": {"exact": "web", "ignoreCase": true}}},
		                           {"header": {"name": ":authority", "stringMatch": {"prefix": "web:", "ignoreCase": true}}}]}},
		    {"orRules": {"rules": [{"header": {"name": ":method", "stringMatch": {"exact": "GET"}}}]}},
		    {"orRules": {"rules": [{"urlPath": {"path": {"prefix": "/api/%d/"}}}]}}]}}],
		  "principals": [{"andIds": {"ids": [{"orIds": {"ids": [{"authenticated": {"principalName": {"exact": "spiffe://cluster.local/ns/demo/sa/frontend"}}},
		                                                        {"authenticated": {"principalName": {"safeRegex": {"regex": ".*/ns/ops/.*"}}}}]}}]}}]}`, i, i))
	}
	r := &rbacv3.RBAC{}
	require.NoError(b, protojson.Unmarshal([]byte(`{"action": "ALLOW", "policies": {`+strings.Join(policies, ",")+`}}`), r))
	e, err := Compile(r)
	require.NoError(b, err)
	in := input(request("GET", "/api/9/items?x=1", "web:80", nil), "10.1.2.3", "10.9.0.1:8080",
		tlsWith([]string{"spiffe://cluster.local/ns/demo/sa/frontend"}, nil, ""))
	require.True(b, e.Evaluate(in).Allowed)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		e.Evaluate(in)
	}
}
