package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// DestinationRule is validated field by field, as VirtualService is.

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
