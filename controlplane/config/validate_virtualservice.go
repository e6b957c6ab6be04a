package config

import (
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// VirtualService is validated field by field: every field either has a translation in the
// xds package or is rejected here with its path, so nothing a user writes is silently ignored.

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
