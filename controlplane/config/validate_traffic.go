package config

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
)

// The traffic kinds (VirtualService, DestinationRule, Sidecar) are validated field by field:
// every field either has a translation in the xds package or is rejected here with its path,
// so nothing a user writes is silently ignored.

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

// ---- VirtualService ----

// MeshGateway is the reserved gateway name of every sidecar.
const MeshGateway = "mesh"

func validateVirtualService(m proto.Message) *FieldError {
	vs := m.(*networking.VirtualService)
	root := path("")
	delegate := len(vs.GetHosts()) == 0
	if delegate && len(vs.GetGateways()) > 0 {
		return root.f("gateways").err("a VirtualService without hosts is a delegate and cannot name gateways")
	}
	for i, h := range vs.GetHosts() {
		p := root.i("hosts", i)
		if h == "*" {
			return p.err(`"*" is not allowed for a VirtualService bound to sidecars; name the hosts`)
		}
		if _, err := netip.ParseAddr(h); err == nil {
			continue
		}
		if err := validateHost(h, true); err != nil {
			return p.wrap(err)
		}
	}
	for i, g := range vs.GetGateways() {
		if fe := validateGatewayName(root.i("gateways", i), g); fe != nil {
			return fe
		}
	}
	if fe := validateExportTo(root.f("exportTo"), vs.GetExportTo()); fe != nil {
		return fe
	}
	if len(vs.GetTcp()) > 0 {
		return root.f("tcp").unsupported("only http routes are translated")
	}
	if len(vs.GetTls()) > 0 {
		return root.f("tls").unsupported("only http routes are translated")
	}
	if len(vs.GetHttp()) == 0 {
		return root.f("http").err("at least one http route is required")
	}
	for i, r := range vs.GetHttp() {
		if fe := validateHTTPRoute(root.i("http", i), r, delegate); fe != nil {
			return fe
		}
	}
	return nil
}

func validateGatewayName(p path, g string) *FieldError {
	if g == MeshGateway {
		return nil
	}
	ns, name, ok := strings.Cut(g, "/")
	if !ok {
		name, ns = ns, ""
	}
	if ns != "" {
		if err := validateDNSLabel(ns, 63); err != nil {
			return p.wrap(err)
		}
	}
	if err := validateDNSLabel(name, 253); err != nil {
		return p.wrap(err)
	}
	return nil
}

func validateHTTPRoute(p path, r *networking.HTTPRoute, inDelegate bool) *FieldError {
	actions := 0
	for _, set := range []bool{len(r.GetRoute()) > 0, r.GetRedirect() != nil, r.GetDirectResponse() != nil, r.GetDelegate() != nil} {
		if set {
			actions++
		}
	}
	if actions == 0 {
		return p.err("one of route, redirect, directResponse or delegate is required")
	}
	if actions > 1 {
		return p.err("route, redirect, directResponse and delegate are mutually exclusive")
	}
	for i, m := range r.GetMatch() {
		if fe := validateHTTPMatch(p.i("match", i), m); fe != nil {
			return fe
		}
	}
	if d := r.GetDelegate(); d != nil {
		if inDelegate {
			return p.f("delegate").err("a delegate VirtualService cannot delegate again")
		}
		if d.GetName() == "" {
			return p.f("delegate.name").err("a name is required")
		}
		if err := validateDNSLabel(d.GetName(), 253); err != nil {
			return p.f("delegate.name").wrap(err)
		}
		if d.GetNamespace() != "" {
			if err := validateDNSLabel(d.GetNamespace(), 63); err != nil {
				return p.f("delegate.namespace").wrap(err)
			}
		}
	}
	total := int64(0)
	for i, d := range r.GetRoute() {
		dp := p.i("route", i)
		if fe := validateDestination(dp.f("destination"), d.GetDestination()); fe != nil {
			return fe
		}
		if d.GetWeight() < 0 {
			return dp.f("weight").err("weight %d must not be negative", d.GetWeight())
		}
		total += int64(d.GetWeight())
		if fe := validateHeaders(dp.f("headers"), d.GetHeaders()); fe != nil {
			return fe
		}
	}
	if len(r.GetRoute()) > 1 && total == 0 {
		return p.f("route").err("the destinations' weights add up to 0; give at least one a positive weight")
	}
	if total > 1<<32-1 {
		return p.f("route").err("the destinations' weights add up to more than 2^32-1")
	}
	if fe := validateRedirect(p.f("redirect"), r.GetRedirect()); fe != nil {
		return fe
	}
	if dr := r.GetDirectResponse(); dr != nil {
		if dr.GetStatus() < 200 || dr.GetStatus() > 599 {
			return p.f("directResponse.status").err("status %d must be in [200, 599]", dr.GetStatus())
		}
		if b := dr.GetBody(); b != nil {
			if b.GetSpecifier() == nil {
				return p.f("directResponse.body").err("one of string or bytes is required")
			}
			if len(b.GetString_())+len(b.GetBytes()) > 1<<20 {
				return p.f("directResponse.body").err("body larger than 1 MiB")
			}
		}
	}
	if rw := r.GetRewrite(); rw != nil {
		rp := p.f("rewrite")
		if r.GetRedirect() != nil || r.GetDirectResponse() != nil {
			return rp.err("rewrite only applies to routes with destinations")
		}
		if rw.GetUri() != "" && rw.GetUriRegexRewrite() != nil {
			return rp.err("uri and uriRegexRewrite are mutually exclusive")
		}
		if rr := rw.GetUriRegexRewrite(); rr != nil {
			if rr.GetMatch() == "" {
				return rp.f("uriRegexRewrite.match").err("a regex is required")
			}
			if _, err := regexp.Compile(rr.GetMatch()); err != nil {
				return rp.f("uriRegexRewrite.match").err("%q is not an RE2 regular expression: %v", rr.GetMatch(), err)
			}
		}
		if a := rw.GetAuthority(); a != "" && strings.ContainsAny(a, " /") {
			return rp.f("authority").err("%q is not a valid authority", a)
		}
		if rw.GetUri() == "" && rw.GetUriRegexRewrite() == nil && rw.GetAuthority() == "" {
			return rp.err("one of uri, uriRegexRewrite or authority is required")
		}
	}
	if fe := validateDuration(p.f("timeout"), r.GetTimeout(), 0); fe != nil {
		return fe
	}
	if fe := validateRetries(p.f("retries"), r.GetRetries()); fe != nil {
		return fe
	}
	if fe := validateFault(p.f("fault"), r.GetFault()); fe != nil {
		return fe
	}
	if r.GetMirror() != nil && len(r.GetMirrors()) > 0 {
		return p.f("mirrors").err("mirror and mirrors are mutually exclusive")
	}
	if r.GetMirror() != nil {
		if fe := validateDestination(p.f("mirror"), r.GetMirror()); fe != nil {
			return fe
		}
	} else if r.GetMirrorPercent() != nil || r.GetMirrorPercentage() != nil {
		return p.f("mirrorPercentage").err("needs a mirror destination")
	}
	if r.GetMirrorPercent() != nil && r.GetMirrorPercentage() != nil {
		return p.f("mirrorPercent").err("mirrorPercent (deprecated) and mirrorPercentage are mutually exclusive")
	}
	if mp := r.GetMirrorPercent(); mp != nil && mp.GetValue() > 100 {
		return p.f("mirrorPercent").err("%d must be in [0, 100]", mp.GetValue())
	}
	if fe := validatePercent(p.f("mirrorPercentage"), r.GetMirrorPercentage()); fe != nil {
		return fe
	}
	for i, m := range r.GetMirrors() {
		mp := p.i("mirrors", i)
		if m.GetDestination() == nil {
			return mp.f("destination").err("a destination is required")
		}
		if fe := firstErr(validateDestination(mp.f("destination"), m.GetDestination()), validatePercent(mp.f("percentage"), m.GetPercentage())); fe != nil {
			return fe
		}
	}
	if fe := validateCors(p.f("corsPolicy"), r.GetCorsPolicy()); fe != nil {
		return fe
	}
	return validateHeaders(p.f("headers"), r.GetHeaders())
}

func validateHTTPMatch(p path, m *networking.HTTPMatchRequest) *FieldError {
	if fe := validateStringMatch(p.f("uri"), m.GetUri(), false, true); fe != nil {
		return fe
	}
	if u := m.GetUri(); u != nil && u.GetRegex() == "*" {
		return p.f("uri.regex").err(`"*" is not a regular expression; use prefix "/" to match every path`)
	}
	for name, sm := range map[string]*networking.StringMatch{"scheme": m.GetScheme(), "method": m.GetMethod(), "authority": m.GetAuthority()} {
		if fe := validateStringMatch(p.f(name), sm, false, true); fe != nil {
			return fe
		}
	}
	for _, group := range []struct {
		name string
		m    map[string]*networking.StringMatch
	}{{"headers", m.GetHeaders()}, {"withoutHeaders", m.GetWithoutHeaders()}} {
		for k, v := range group.m {
			hp := p.k(group.name, k)
			if strings.HasPrefix(k, "@") {
				return hp.unsupported("JWT claim matching needs RequestAuthentication")
			}
			if fe := validateHeaderName(hp, k); fe != nil {
				return fe
			}
			if k != strings.ToLower(k) {
				return hp.err("header names must be lower case")
			}
			if fe := validateStringMatch(hp, v, true, true); fe != nil {
				return fe
			}
		}
	}
	for k, v := range m.GetQueryParams() {
		qp := p.k("queryParams", k)
		if k == "" {
			return qp.err("empty query parameter name")
		}
		if fe := validateStringMatch(qp, v, true, false); fe != nil {
			return fe
		}
	}
	if m.GetPort() != 0 {
		if fe := validatePortNumber(string(p.f("port")), m.GetPort(), false); fe != nil {
			return fe
		}
	}
	if fe := validateLabels(string(p.f("sourceLabels")), m.GetSourceLabels()); fe != nil {
		return fe
	}
	for i, g := range m.GetGateways() {
		if fe := validateGatewayName(p.i("gateways", i), g); fe != nil {
			return fe
		}
	}
	if ns := m.GetSourceNamespace(); ns != "" {
		if err := validateDNSLabel(ns, 63); err != nil {
			return p.f("sourceNamespace").wrap(err)
		}
	}
	return nil
}

func validateDestination(p path, d *networking.Destination) *FieldError {
	if d == nil {
		return p.err("a destination is required")
	}
	if d.GetHost() == "" {
		return p.f("host").err("a host is required")
	}
	if _, err := netip.ParseAddr(d.GetHost()); err != nil {
		if err := validateHost(d.GetHost(), false); err != nil {
			return p.f("host").wrap(err)
		}
	}
	if s := d.GetSubset(); s != "" {
		if err := validateDNSLabel(s, 63); err != nil {
			return p.f("subset").wrap(err)
		}
	}
	if d.GetPort() != nil {
		if fe := validatePortNumber(string(p.f("port.number")), d.GetPort().GetNumber(), false); fe != nil {
			return fe
		}
	}
	return nil
}

func validateRedirect(p path, r *networking.HTTPRedirect) *FieldError {
	if r == nil {
		return nil
	}
	switch r.GetRedirectCode() {
	case 0, 301, 302, 303, 307, 308:
	default:
		return p.f("redirectCode").err("%d is not one of 301, 302, 303, 307, 308", r.GetRedirectCode())
	}
	if r.GetUri() != "" && r.GetPrefixRewrite() != "" {
		return p.err("uri and prefixRewrite are mutually exclusive")
	}
	if r.GetUri() == "" && r.GetAuthority() == "" && r.GetPrefixRewrite() == "" && r.GetScheme() == "" && r.GetRedirectPort() == nil {
		return p.err("one of uri, prefixRewrite, authority, scheme, port or derivePort is required")
	}
	if pt, ok := r.GetRedirectPort().(*networking.HTTPRedirect_Port); ok {
		if fe := validatePortNumber(string(p.f("port")), pt.Port, false); fe != nil {
			return fe
		}
	}
	if s := r.GetScheme(); s != "" && s != "http" && s != "https" {
		return p.f("scheme").err("%q: want http or https", s)
	}
	return nil
}

// Retry conditions Envoy's router accepts in retry_on (HTTP and gRPC).
var retryOnPolicies = map[string]bool{
	"5xx": true, "gateway-error": true, "reset": true, "reset-before-request": true, "connect-failure": true,
	"envoy-ratelimited": true, "retriable-4xx": true, "refused-stream": true, "retriable-status-codes": true,
	"retriable-headers": true, "http3-post-connect-failure": true,
	"cancelled": true, "deadline-exceeded": true, "internal": true, "resource-exhausted": true, "unavailable": true,
}

func validateRetries(p path, r *networking.HTTPRetry) *FieldError {
	if r == nil {
		return nil
	}
	if r.GetAttempts() < 0 {
		return p.f("attempts").err("%d must not be negative", r.GetAttempts())
	}
	if r.GetAttempts() == 0 && (r.GetPerTryTimeout() != nil || r.GetRetryOn() != "" || r.GetBackoff() != nil) {
		return p.f("attempts").err("0 disables retries; perTryTimeout, retryOn and backoff need attempts > 0")
	}
	if fe := validateDuration(p.f("perTryTimeout"), r.GetPerTryTimeout(), time.Millisecond); fe != nil {
		return fe
	}
	if fe := validateDuration(p.f("backoff"), r.GetBackoff(), time.Millisecond); fe != nil {
		return fe
	}
	for _, part := range strings.Split(r.GetRetryOn(), ",") {
		part = strings.TrimSpace(part)
		if part == "" || retryOnPolicies[part] {
			continue
		}
		if code, err := strconv.Atoi(part); err == nil && code >= 100 && code <= 599 {
			continue
		}
		return p.f("retryOn").err("%q is not a retry condition or an HTTP status code", part)
	}
	return nil
}

// GRPCStatusCodes maps gRPC status names to their codes, for fault aborts.
var GRPCStatusCodes = map[string]uint32{
	"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
	"ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
	"ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
	"DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}

// GRPCStatusCode reads a fault's grpcStatus: a status name or its number.
func GRPCStatusCode(s string) (uint32, bool) {
	if c, ok := GRPCStatusCodes[strings.ToUpper(s)]; ok {
		return c, true
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 16 {
		return uint32(n), true
	}
	return 0, false
}

func validateFault(p path, f *networking.HTTPFaultInjection) *FieldError {
	if f == nil {
		return nil
	}
	if f.GetDelay() == nil && f.GetAbort() == nil {
		return p.err("one of delay or abort is required")
	}
	if d := f.GetDelay(); d != nil {
		dp := p.f("delay")
		if d.GetPercent() < 0 || d.GetPercent() > 100 {
			return dp.f("percent").err("%d must be in [0, 100]", d.GetPercent())
		}
		if d.GetPercent() != 0 && d.GetPercentage() != nil {
			return dp.f("percent").err("percent (deprecated) and percentage are mutually exclusive")
		}
		if fe := validatePercent(dp.f("percentage"), d.GetPercentage()); fe != nil {
			return fe
		}
		switch t := d.GetHttpDelayType().(type) {
		case nil:
			return dp.f("fixedDelay").err("a delay is required")
		case *networking.HTTPFaultInjection_Delay_FixedDelay:
			if t.FixedDelay == nil {
				return dp.f("fixedDelay").err("a delay is required")
			}
			if fe := validateDuration(dp.f("fixedDelay"), t.FixedDelay, time.Millisecond); fe != nil {
				return fe
			}
		case *networking.HTTPFaultInjection_Delay_ExponentialDelay:
			return dp.f("exponentialDelay").unsupported("Envoy has no exponential fault delay; use fixedDelay")
		}
	}
	if a := f.GetAbort(); a != nil {
		ap := p.f("abort")
		if fe := validatePercent(ap.f("percentage"), a.GetPercentage()); fe != nil {
			return fe
		}
		switch t := a.GetErrorType().(type) {
		case nil:
			return ap.f("httpStatus").err("one of httpStatus or grpcStatus is required")
		case *networking.HTTPFaultInjection_Abort_HttpStatus:
			if t.HttpStatus < 200 || t.HttpStatus > 599 {
				return ap.f("httpStatus").err("%d must be in [200, 599]", t.HttpStatus)
			}
		case *networking.HTTPFaultInjection_Abort_GrpcStatus:
			if _, ok := GRPCStatusCode(t.GrpcStatus); !ok {
				return ap.f("grpcStatus").err("%q is not a gRPC status (e.g. UNAVAILABLE)", t.GrpcStatus)
			}
		case *networking.HTTPFaultInjection_Abort_Http2Error:
			return ap.f("http2Error").unsupported("Envoy's fault filter cannot abort with an HTTP/2 error")
		}
	}
	return nil
}

var corsMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true,
	"CONNECT": true, "OPTIONS": true, "TRACE": true, "PATCH": true, "*": true}

func validateCors(p path, c *networking.CorsPolicy) *FieldError {
	if c == nil {
		return nil
	}
	if len(c.GetAllowOrigin()) > 0 && len(c.GetAllowOrigins()) > 0 {
		return p.f("allowOrigin").err("allowOrigin (deprecated) and allowOrigins are mutually exclusive")
	}
	for i, o := range c.GetAllowOrigins() {
		if fe := validateStringMatch(p.i("allowOrigins", i), o, false, true); fe != nil {
			return fe
		}
	}
	for i, m := range c.GetAllowMethods() {
		if !corsMethods[m] {
			return p.i("allowMethods", i).err("%q is not an HTTP method", m)
		}
	}
	for i, h := range c.GetAllowHeaders() {
		if h != "*" {
			if fe := validateHeaderName(p.i("allowHeaders", i), h); fe != nil {
				return fe
			}
		}
	}
	for i, h := range c.GetExposeHeaders() {
		if h != "*" {
			if fe := validateHeaderName(p.i("exposeHeaders", i), h); fe != nil {
				return fe
			}
		}
	}
	if ma := c.GetMaxAge(); ma != nil {
		if fe := validateDuration(p.f("maxAge"), ma, time.Second); fe != nil {
			return fe
		}
		if ma.GetNanos() != 0 {
			return p.f("maxAge").err("whole seconds only (the Access-Control-Max-Age header counts seconds)")
		}
	}
	return nil
}

func validateHeaders(p path, h *networking.Headers) *FieldError {
	if h == nil {
		return nil
	}
	for _, dir := range []struct {
		name string
		ops  *networking.Headers_HeaderOperations
		req  bool
	}{{"request", h.GetRequest(), true}, {"response", h.GetResponse(), false}} {
		dp := p.f(dir.name)
		for _, op := range []struct {
			name string
			m    map[string]string
		}{{"set", dir.ops.GetSet()}, {"add", dir.ops.GetAdd()}} {
			for k := range op.m {
				kp := dp.k(op.name, k)
				if fe := validateHeaderName(kp, k); fe != nil {
					return fe
				}
				if IsAuthorityHeader(k) {
					if !dir.req {
						return kp.err("%q is a request header", k)
					}
					continue // rewrites the authority, as in Istio
				}
				if strings.HasPrefix(k, ":") {
					return kp.err("pseudo-header %q cannot be modified", k)
				}
			}
		}
		for i, k := range dir.ops.GetRemove() {
			kp := dp.i("remove", i)
			if fe := validateHeaderName(kp, k); fe != nil {
				return fe
			}
			if strings.HasPrefix(k, ":") || strings.EqualFold(k, "host") {
				return kp.err("%q cannot be removed", k)
			}
		}
	}
	return nil
}

// IsAuthorityHeader reports whether a header name means the request authority (":authority" or "host").
func IsAuthorityHeader(k string) bool {
	return strings.EqualFold(k, ":authority") || strings.EqualFold(k, "host")
}

// ---- DestinationRule ----

func validateDestinationRule(m proto.Message) *FieldError {
	dr := m.(*networking.DestinationRule)
	root := path("")
	if dr.GetHost() == "" {
		return root.f("host").err("a host is required")
	}
	if dr.GetHost() == "*" {
		return root.f("host").err(`"*" is not allowed; use a wildcard domain such as "*.example.com"`)
	}
	if _, err := netip.ParseAddr(dr.GetHost()); err != nil {
		if err := validateHost(dr.GetHost(), true); err != nil {
			return root.f("host").wrap(err)
		}
	}
	if fe := validateTrafficPolicy(root.f("trafficPolicy"), dr.GetTrafficPolicy(), true); fe != nil {
		return fe
	}
	seen := map[string]bool{}
	for i, s := range dr.GetSubsets() {
		sp := root.i("subsets", i)
		if s.GetName() == "" {
			return sp.f("name").err("a subset name is required")
		}
		if err := validateDNSLabel(s.GetName(), 63); err != nil {
			return sp.f("name").wrap(err)
		}
		if seen[s.GetName()] {
			return sp.f("name").err("duplicate subset %q", s.GetName())
		}
		seen[s.GetName()] = true
		if fe := validateLabels(string(sp.f("labels")), s.GetLabels()); fe != nil {
			return fe
		}
		if fe := validateTrafficPolicy(sp.f("trafficPolicy"), s.GetTrafficPolicy(), true); fe != nil {
			return fe
		}
	}
	if ws := dr.GetWorkloadSelector(); ws != nil {
		if fe := validateSelectorLabels(root.f("workloadSelector.matchLabels"), ws.GetMatchLabels(), true); fe != nil {
			return fe
		}
	}
	return validateExportTo(root.f("exportTo"), dr.GetExportTo())
}

func validateTrafficPolicy(p path, tp *networking.TrafficPolicy, allowPortLevel bool) *FieldError {
	if tp == nil {
		return nil
	}
	if tp.GetLoadBalancer() == nil && tp.GetConnectionPool() == nil && tp.GetOutlierDetection() == nil && tp.GetTls() == nil &&
		len(tp.GetPortLevelSettings()) == 0 && tp.GetTunnel() == nil && tp.GetProxyProtocol() == nil && tp.GetRetryBudget() == nil {
		return p.err("at least one of loadBalancer, connectionPool, outlierDetection, tls, portLevelSettings, proxyProtocol or retryBudget is required")
	}
	if tp.GetTunnel() != nil {
		return p.f("tunnel").unsupported("no HTTP CONNECT tunnelling in the sidecar generators")
	}
	if fe := firstErr(
		validateLoadBalancer(p.f("loadBalancer"), tp.GetLoadBalancer()),
		validateConnectionPool(p.f("connectionPool"), tp.GetConnectionPool()),
		validateOutlierDetection(p.f("outlierDetection"), tp.GetOutlierDetection()),
		validateClientTLS(p.f("tls"), tp.GetTls()),
	); fe != nil {
		return fe
	}
	if rb := tp.GetRetryBudget(); rb != nil {
		if v := rb.GetPercent(); v != nil && (v.GetValue() < 0 || v.GetValue() > 100) {
			return p.f("retryBudget.percent").err("%v must be in [0, 100]", v.GetValue())
		}
		if rb.GetBudgetInterval() != nil {
			return p.f("retryBudget.budgetInterval").unsupported("Envoy's retry budget has no interval")
		}
	}
	if len(tp.GetPortLevelSettings()) > 0 && !allowPortLevel {
		return p.f("portLevelSettings").err("not allowed here")
	}
	ports := map[uint32]bool{}
	for i, pl := range tp.GetPortLevelSettings() {
		pp := p.i("portLevelSettings", i)
		if pl.GetPort() == nil {
			return pp.f("port").err("a port is required")
		}
		if fe := validatePortNumber(string(pp.f("port.number")), pl.GetPort().GetNumber(), false); fe != nil {
			return fe
		}
		if ports[pl.GetPort().GetNumber()] {
			return pp.f("port.number").err("duplicate port %d", pl.GetPort().GetNumber())
		}
		ports[pl.GetPort().GetNumber()] = true
		if pl.GetLoadBalancer() == nil && pl.GetConnectionPool() == nil && pl.GetOutlierDetection() == nil && pl.GetTls() == nil {
			return pp.err("at least one of loadBalancer, connectionPool, outlierDetection or tls is required")
		}
		if fe := firstErr(
			validateLoadBalancer(pp.f("loadBalancer"), pl.GetLoadBalancer()),
			validateConnectionPool(pp.f("connectionPool"), pl.GetConnectionPool()),
			validateOutlierDetection(pp.f("outlierDetection"), pl.GetOutlierDetection()),
			validateClientTLS(pp.f("tls"), pl.GetTls()),
		); fe != nil {
			return fe
		}
	}
	return nil
}

func validateLoadBalancer(p path, lb *networking.LoadBalancerSettings) *FieldError {
	if lb == nil {
		return nil
	}
	if ch := lb.GetConsistentHash(); ch != nil {
		cp := p.f("consistentHash")
		switch k := ch.GetHashKey().(type) {
		case nil:
			return cp.err("one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
			if fe := validateHeaderName(cp.f("httpHeaderName"), k.HttpHeaderName); fe != nil {
				return fe
			}
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
			c := k.HttpCookie
			if c.GetName() == "" {
				return cp.f("httpCookie.name").err("a cookie name is required")
			}
			if fe := validateDuration(cp.f("httpCookie.ttl"), c.GetTtl(), 0); fe != nil {
				return fe
			}
			for i, a := range c.GetAttributes() {
				if a.GetName() == "" {
					return cp.i("httpCookie.attributes", i).f("name").err("a name is required")
				}
			}
		case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
			if !k.UseSourceIp {
				return cp.f("useSourceIp").err("must be true when set")
			}
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
			if k.HttpQueryParameterName == "" {
				return cp.f("httpQueryParameterName").err("a parameter name is required")
			}
		}
		if ch.GetMinimumRingSize() != 0 && ch.GetHashAlgorithm() != nil {
			return cp.f("minimumRingSize").err("deprecated; set ringHash.minimumRingSize instead of both")
		}
		if mg := ch.GetMaglev(); mg != nil && mg.GetTableSize() != 0 && !isPrime(mg.GetTableSize()) {
			return cp.f("maglev.tableSize").err("%d must be a prime number", mg.GetTableSize())
		}
	}
	if lb.GetZoneAwareLbSetting() != nil {
		return p.f("zoneAwareLbSetting").unsupported("zone aware routing needs a local cluster the sidecar does not have")
	}
	if ll := lb.GetLocalityLbSetting(); ll != nil {
		if fe := validateLocalityLB(p.f("localityLbSetting"), ll); fe != nil {
			return fe
		}
	}
	warm := lb.GetWarmupDurationSecs() != nil || lb.GetWarmup() != nil
	if lb.GetWarmupDurationSecs() != nil && lb.GetWarmup() != nil {
		return p.f("warmupDurationSecs").err("deprecated; set warmup instead of both")
	}
	if warm {
		switch lb.GetSimple() {
		case networking.LoadBalancerSettings_UNSPECIFIED, networking.LoadBalancerSettings_ROUND_ROBIN,
			networking.LoadBalancerSettings_LEAST_REQUEST, networking.LoadBalancerSettings_LEAST_CONN:
		default:
			return p.f("warmup").err("slow start applies to ROUND_ROBIN and LEAST_REQUEST only")
		}
		if lb.GetConsistentHash() != nil {
			return p.f("warmup").err("slow start applies to ROUND_ROBIN and LEAST_REQUEST only")
		}
	}
	if fe := validateDuration(p.f("warmupDurationSecs"), lb.GetWarmupDurationSecs(), time.Millisecond); fe != nil {
		return fe
	}
	if w := lb.GetWarmup(); w != nil {
		wp := p.f("warmup")
		if w.GetDuration() == nil {
			return wp.f("duration").err("a duration is required")
		}
		if fe := validateDuration(wp.f("duration"), w.GetDuration(), time.Millisecond); fe != nil {
			return fe
		}
		if v := w.GetMinimumPercent(); v != nil && (v.GetValue() < 0 || v.GetValue() > 100) {
			return wp.f("minimumPercent").err("%v must be in [0, 100]", v.GetValue())
		}
		if v := w.GetAggression(); v != nil && v.GetValue() < 1 {
			return wp.f("aggression").err("%v must be at least 1", v.GetValue())
		}
	}
	return nil
}

func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for d := uint64(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

func validateLocality(s string, wildcard bool) error {
	if s == "" {
		return errors.New("empty locality")
	}
	parts := strings.Split(s, "/")
	if len(parts) > 3 {
		return fmt.Errorf("%q: want region[/zone[/subzone]]", s)
	}
	for i, part := range parts {
		if part == "" {
			return fmt.Errorf("%q: empty segment", s)
		}
		if part == "*" {
			if !wildcard {
				return fmt.Errorf("%q: wildcards are not allowed here", s)
			}
			if i != len(parts)-1 {
				return fmt.Errorf("%q: a wildcard must be the last segment", s)
			}
		}
	}
	return nil
}

func validateLocalityLB(p path, ll *networking.LocalityLoadBalancerSetting) *FieldError {
	if len(ll.GetDistribute()) > 0 && (len(ll.GetFailover()) > 0 || len(ll.GetFailoverPriority()) > 0) {
		return p.f("distribute").err("distribute and failover are mutually exclusive")
	}
	froms := map[string]bool{}
	for i, d := range ll.GetDistribute() {
		dp := p.i("distribute", i)
		if err := validateLocality(d.GetFrom(), true); err != nil {
			return dp.f("from").wrap(err)
		}
		if froms[d.GetFrom()] {
			return dp.f("from").err("duplicate %q", d.GetFrom())
		}
		froms[d.GetFrom()] = true
		var sum uint32
		for to, w := range d.GetTo() {
			if err := validateLocality(to, true); err != nil {
				return dp.k("to", to).wrap(err)
			}
			if w == 0 {
				return dp.k("to", to).err("weight must be positive")
			}
			sum += w
		}
		if sum != 100 {
			return dp.f("to").err("weights add up to %d, want 100", sum)
		}
	}
	for i, f := range ll.GetFailover() {
		fp := p.i("failover", i)
		if f.GetFrom() == "" || strings.Contains(f.GetFrom(), "/") {
			return fp.f("from").err("%q: want a region", f.GetFrom())
		}
		if f.GetTo() == "" || strings.Contains(f.GetTo(), "/") {
			return fp.f("to").err("%q: want a region", f.GetTo())
		}
		if f.GetFrom() == f.GetTo() {
			return fp.err("from and to are the same region %q", f.GetFrom())
		}
	}
	for i, l := range ll.GetFailoverPriority() {
		if l == "" {
			return p.i("failoverPriority", i).err("empty label")
		}
	}
	return nil
}

func validateConnectionPool(p path, cp *networking.ConnectionPoolSettings) *FieldError {
	if cp == nil {
		return nil
	}
	if cp.GetTcp() == nil && cp.GetHttp() == nil {
		return p.err("one of tcp or http is required")
	}
	if t := cp.GetTcp(); t != nil {
		tp := p.f("tcp")
		if t.GetMaxConnections() < 0 {
			return tp.f("maxConnections").err("must not be negative")
		}
		if fe := firstErr(
			validateDuration(tp.f("connectTimeout"), t.GetConnectTimeout(), time.Millisecond),
			validateDuration(tp.f("maxConnectionDuration"), t.GetMaxConnectionDuration(), time.Millisecond),
			validateDuration(tp.f("idleTimeout"), t.GetIdleTimeout(), 0),
		); fe != nil {
			return fe
		}
		if ka := t.GetTcpKeepalive(); ka != nil {
			if fe := firstErr(
				validateDuration(tp.f("tcpKeepalive.time"), ka.GetTime(), time.Second),
				validateDuration(tp.f("tcpKeepalive.interval"), ka.GetInterval(), time.Second),
			); fe != nil {
				return fe
			}
		}
	}
	if h := cp.GetHttp(); h != nil {
		hp := p.f("http")
		for name, v := range map[string]int32{"http1MaxPendingRequests": h.GetHttp1MaxPendingRequests(), "http2MaxRequests": h.GetHttp2MaxRequests(),
			"maxRequestsPerConnection": h.GetMaxRequestsPerConnection(), "maxRetries": h.GetMaxRetries(), "maxConcurrentStreams": h.GetMaxConcurrentStreams()} {
			if v < 0 {
				return hp.f(name).err("must not be negative")
			}
		}
		if fe := validateDuration(hp.f("idleTimeout"), h.GetIdleTimeout(), time.Millisecond); fe != nil {
			return fe
		}
		if ka := h.GetHttp2KeepAlive(); ka != nil {
			if ka.GetInterval() == nil {
				return hp.f("http2KeepAlive.interval").err("an interval is required")
			}
			if fe := firstErr(
				validateDuration(hp.f("http2KeepAlive.interval"), ka.GetInterval(), time.Millisecond),
				validateDuration(hp.f("http2KeepAlive.timeout"), ka.GetTimeout(), time.Millisecond),
			); fe != nil {
				return fe
			}
		}
	}
	return nil
}

func validateOutlierDetection(p path, od *networking.OutlierDetection) *FieldError {
	if od == nil {
		return nil
	}
	if od.GetConsecutiveErrors() != 0 {
		return p.f("consecutiveErrors").err("deprecated and not translated; use consecutive5xxErrors or consecutiveGatewayErrors")
	}
	if len(od.GetOutlierDetectionHttpErrorCodes()) > 0 {
		return p.f("outlierDetectionHttpErrorCodes").unsupported("Envoy's outlier detection counts 5xx and gateway errors only")
	}
	if od.GetMaxEjectionPercent() < 0 || od.GetMaxEjectionPercent() > 100 {
		return p.f("maxEjectionPercent").err("%d must be in [0, 100]", od.GetMaxEjectionPercent())
	}
	if od.GetMinHealthPercent() < 0 || od.GetMinHealthPercent() > 100 {
		return p.f("minHealthPercent").err("%d must be in [0, 100]", od.GetMinHealthPercent())
	}
	if od.GetConsecutiveLocalOriginFailures() != nil && !od.GetSplitExternalLocalOriginErrors() {
		return p.f("consecutiveLocalOriginFailures").err("needs splitExternalLocalOriginErrors: true")
	}
	return firstErr(
		validateDuration(p.f("interval"), od.GetInterval(), time.Millisecond),
		validateDuration(p.f("baseEjectionTime"), od.GetBaseEjectionTime(), time.Millisecond),
	)
}

func validateClientTLS(p path, t *networking.ClientTLSSettings) *FieldError {
	if t == nil {
		return nil
	}
	if t.GetCredentialName() != "" {
		return p.f("credentialName").unsupported("no secret store; use clientCertificate, privateKey and caCertificates files")
	}
	for i, san := range t.GetSubjectAltNames() {
		if san == "" {
			return p.i("subjectAltNames", i).err("empty name")
		}
	}
	switch t.GetMode() {
	case networking.ClientTLSSettings_DISABLE:
		if t.GetClientCertificate() != "" || t.GetPrivateKey() != "" || t.GetCaCertificates() != "" || t.GetSni() != "" ||
			len(t.GetSubjectAltNames()) > 0 || t.GetInsecureSkipVerify() != nil || t.GetCaCrl() != "" {
			return p.f("mode").err("DISABLE takes no other TLS fields")
		}
	case networking.ClientTLSSettings_ISTIO_MUTUAL:
		for name, v := range map[string]string{"clientCertificate": t.GetClientCertificate(), "privateKey": t.GetPrivateKey(),
			"caCertificates": t.GetCaCertificates(), "caCrl": t.GetCaCrl()} {
			if v != "" {
				return p.f(name).err("ISTIO_MUTUAL uses the workload's Istio certificates; remove it")
			}
		}
		if t.GetInsecureSkipVerify() != nil {
			return p.f("insecureSkipVerify").err("ISTIO_MUTUAL always verifies the peer")
		}
	case networking.ClientTLSSettings_SIMPLE:
		if t.GetClientCertificate() != "" || t.GetPrivateKey() != "" {
			return p.f("clientCertificate").err("SIMPLE presents no client certificate; use MUTUAL")
		}
	case networking.ClientTLSSettings_MUTUAL:
		if t.GetClientCertificate() == "" {
			return p.f("clientCertificate").err("MUTUAL needs a client certificate file")
		}
		if t.GetPrivateKey() == "" {
			return p.f("privateKey").err("MUTUAL needs a private key file")
		}
	}
	if t.GetInsecureSkipVerify().GetValue() && (t.GetCaCertificates() != "" || len(t.GetSubjectAltNames()) > 0) {
		return p.f("insecureSkipVerify").err("skipping verification contradicts caCertificates/subjectAltNames")
	}
	return nil
}

// ---- Sidecar ----

func validateSidecar(m proto.Message) *FieldError {
	sc := m.(*networking.Sidecar)
	root := path("")
	if ws := sc.GetWorkloadSelector(); ws != nil {
		if fe := validateSelectorLabels(root.f("workloadSelector.labels"), ws.GetLabels(), true); fe != nil {
			return fe
		}
	}
	ingressPorts := map[uint32]bool{}
	for i, in := range sc.GetIngress() {
		ip := root.i("ingress", i)
		if in.GetPort() == nil {
			return ip.f("port").err("a port is required")
		}
		if fe := validateSidecarPort(ip.f("port"), in.GetPort()); fe != nil {
			return fe
		}
		if ingressPorts[in.GetPort().GetNumber()] {
			return ip.f("port.number").err("duplicate port %d", in.GetPort().GetNumber())
		}
		ingressPorts[in.GetPort().GetNumber()] = true
		if in.GetTls() != nil {
			return ip.f("tls").unsupported("no server certificates for sidecar ingress listeners")
		}
		if in.GetBind() != "" {
			if _, err := netip.ParseAddr(in.GetBind()); err != nil {
				return ip.f("bind").err("%q is not an IP address", in.GetBind())
			}
		}
		if in.GetCaptureMode() == networking.CaptureMode_NONE && in.GetBind() == "" {
			return ip.f("bind").err("captureMode NONE needs a bind address")
		}
		if fe := validateDefaultEndpoint(ip.f("defaultEndpoint"), in.GetDefaultEndpoint()); fe != nil {
			return fe
		}
		if fe := validateConnectionPool(ip.f("connectionPool"), in.GetConnectionPool()); fe != nil {
			return fe
		}
	}
	catchAll := -1
	egressPorts := map[uint32]bool{}
	for i, eg := range sc.GetEgress() {
		ep := root.i("egress", i)
		if eg.GetPort() == nil {
			if catchAll >= 0 {
				return ep.f("port").err("egress[%d] already has no port; only one egress listener may catch all ports", catchAll)
			}
			catchAll = i
			if eg.GetBind() != "" || eg.GetCaptureMode() != networking.CaptureMode_DEFAULT {
				return ep.f("bind").err("bind and captureMode need a port")
			}
		} else {
			if fe := validateSidecarPort(ep.f("port"), eg.GetPort()); fe != nil {
				return fe
			}
			if egressPorts[eg.GetPort().GetNumber()] {
				return ep.f("port.number").err("duplicate port %d", eg.GetPort().GetNumber())
			}
			egressPorts[eg.GetPort().GetNumber()] = true
		}
		if eg.GetBind() != "" {
			if _, err := netip.ParseAddr(eg.GetBind()); err != nil {
				return ep.f("bind").err("%q is not an IP address", eg.GetBind())
			}
		}
		if eg.GetCaptureMode() == networking.CaptureMode_NONE && eg.GetBind() == "" {
			return ep.f("bind").err("captureMode NONE needs a bind address")
		}
		if len(eg.GetHosts()) == 0 {
			return ep.f("hosts").err("at least one host is required")
		}
		for j, h := range eg.GetHosts() {
			if fe := validateEgressHost(ep.i("hosts", j), h); fe != nil {
				return fe
			}
		}
	}
	if otp := sc.GetOutboundTrafficPolicy(); otp != nil {
		if ep := otp.GetEgressProxy(); ep != nil {
			if otp.GetMode() != networking.OutboundTrafficPolicy_ALLOW_ANY {
				return root.f("outboundTrafficPolicy.egressProxy").err("needs mode ALLOW_ANY")
			}
			if fe := validateDestination(root.f("outboundTrafficPolicy.egressProxy"), ep); fe != nil {
				return fe
			}
			if ep.GetPort() == nil {
				return root.f("outboundTrafficPolicy.egressProxy.port").err("a port is required")
			}
		}
	}
	return validateConnectionPool(root.f("inboundConnectionPool"), sc.GetInboundConnectionPool())
}

func validateSidecarPort(p path, sp *networking.SidecarPort) *FieldError {
	if fe := validatePortNumber(string(p.f("number")), sp.GetNumber(), false); fe != nil {
		return fe
	}
	if sp.GetTargetPort() != 0 {
		return p.f("targetPort").err("not used by Sidecar listeners; remove it")
	}
	if pr := sp.GetProtocol(); pr != "" && !protocols[strings.ToUpper(pr)] {
		return p.f("protocol").err("unknown protocol %q", pr)
	}
	return nil
}

// validateDefaultEndpoint accepts Istio's forms: 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT,
// [::]:PORT and unix:///path.
func validateDefaultEndpoint(p path, ep string) *FieldError {
	if ep == "" {
		return nil
	}
	if strings.HasPrefix(ep, "unix://") {
		return p.unsupported("unix domain socket endpoints")
	}
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return p.err("%q: want 127.0.0.1:PORT or 0.0.0.0:PORT", ep)
	}
	a := ap.Addr()
	if !a.IsLoopback() && !a.IsUnspecified() {
		return p.err("%q: the address must be a loopback (127.0.0.1, ::1) or unspecified (0.0.0.0, ::) address", ep)
	}
	if ap.Port() == 0 {
		return p.err("%q: a port is required", ep)
	}
	return nil
}

// validateEgressHost checks "namespace/host" with namespace "*", ".", "~" or a name, and host
// "*", "*.suffix" or a DNS name.
func validateEgressHost(p path, h string) *FieldError {
	ns, host, ok := strings.Cut(h, "/")
	if !ok || ns == "" || host == "" {
		return p.err("%q must be namespace/host (e.g. \"./*\", \"istio-system/*\", \"*/reviews.shop.svc.cluster.local\")", h)
	}
	switch ns {
	case "*", ".", "~":
	default:
		if err := validateDNSLabel(ns, 63); err != nil {
			return p.wrap(err)
		}
	}
	if err := validateHost(host, true); err != nil {
		return p.wrap(err)
	}
	return nil
}
