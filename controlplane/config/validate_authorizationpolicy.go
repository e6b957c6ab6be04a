package config

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	security "istio.io/api/security/v1beta1"
)

// AuthorizationPolicy is validated by Istio's rules (pkg/config/validation's
// ValidateAuthorizationPolicy and pkg/config/security's ValidateAttribute), each failure
// naming its field. What wasmesh does not translate is refused rather than ignored: CUSTOM
// (no external authorizer), targetRefs (no waypoints or gateways), requestPrincipals and
// request.auth.* (no RequestAuthentication, so no JWT principal to match), path templates
// and experimental.envoy.filters.* conditions.

// authzConditionKeys are the `when` keys Istio accepts that wasmesh translates; keys with
// a [name] part are matched by prefix.
var authzConditionKeys = map[string]bool{
	"source.ip": true, "remote.ip": true, "source.namespace": true, "source.principal": true,
	"source.serviceAccount": true, "source.trustDomain": true,
	"destination.ip": true, "destination.port": true, "connection.sni": true,
}

func validateAuthorizationPolicy(m proto.Message) *FieldError {
	ap := m.(*security.AuthorizationPolicy)
	root := path("")
	if ap.GetTargetRef() != nil || len(ap.GetTargetRefs()) > 0 {
		return root.f("targetRefs").unsupported("policies attach to workloads by selector only; there are no waypoints or gateways")
	}
	if sel := ap.GetSelector(); sel != nil {
		if fe := validateSelectorLabels(root.f("selector.matchLabels"), sel.GetMatchLabels(), false); fe != nil {
			return fe
		}
	}
	switch ap.GetAction() {
	case security.AuthorizationPolicy_ALLOW, security.AuthorizationPolicy_DENY, security.AuthorizationPolicy_AUDIT:
	case security.AuthorizationPolicy_CUSTOM:
		if ap.GetProvider().GetName() == "" {
			return root.f("provider.name").err("CUSTOM needs a provider name")
		}
		return root.f("action").unsupported("CUSTOM needs an external authorization provider")
	default:
		return root.f("action").err("unknown action %v", ap.GetAction())
	}
	if ap.GetProvider() != nil {
		return root.f("provider").err("provider is only for the CUSTOM action, not %s", ap.GetAction())
	}
	if ap.GetAction() == security.AuthorizationPolicy_DENY && ap.GetRules() == nil {
		return root.f("rules").err("a DENY policy without rules never matches; add an empty rule {} to deny every request")
	}
	for i, r := range ap.GetRules() {
		if fe := validateAuthzRule(root.i("rules", i), r); fe != nil {
			return fe
		}
	}
	return nil
}

func validateAuthzRule(p path, r *security.Rule) *FieldError {
	if r == nil {
		return p.err("a rule must not be null")
	}
	for i, f := range r.GetFrom() {
		if fe := validateAuthzSource(p.i("from", i), f); fe != nil {
			return fe
		}
	}
	for i, t := range r.GetTo() {
		if fe := validateAuthzOperation(p.i("to", i), t); fe != nil {
			return fe
		}
	}
	for i, c := range r.GetWhen() {
		if fe := validateAuthzCondition(p.i("when", i), c); fe != nil {
			return fe
		}
	}
	return nil
}

func validateAuthzSource(p path, f *security.Rule_From) *FieldError {
	if f == nil || f.GetSource() == nil {
		return p.f("source").err("a source is required")
	}
	s := f.GetSource()
	p = p.f("source")
	if len(s.GetRequestPrincipals())+len(s.GetNotRequestPrincipals()) > 0 {
		return p.f("requestPrincipals").unsupported("no RequestAuthentication, so requests carry no JWT principal")
	}
	if len(s.GetServiceAccounts())+len(s.GetNotServiceAccounts()) > 0 &&
		len(s.GetPrincipals())+len(s.GetNotPrincipals())+len(s.GetNamespaces())+len(s.GetNotNamespaces()) > 0 {
		return p.f("serviceAccounts").err("cannot be set with namespaces or principals")
	}
	return checkAuthzLists(p, "a source", []authzList{
		{"principals", s.GetPrincipals(), nil}, {"notPrincipals", s.GetNotPrincipals(), nil},
		{"namespaces", s.GetNamespaces(), nil}, {"notNamespaces", s.GetNotNamespaces(), nil},
		{"serviceAccounts", s.GetServiceAccounts(), checkServiceAccount}, {"notServiceAccounts", s.GetNotServiceAccounts(), checkServiceAccount},
		{"trustDomains", s.GetTrustDomains(), checkWildcards}, {"notTrustDomains", s.GetNotTrustDomains(), checkWildcards},
		{"ipBlocks", s.GetIpBlocks(), checkIPBlock}, {"notIpBlocks", s.GetNotIpBlocks(), checkIPBlock},
		{"remoteIpBlocks", s.GetRemoteIpBlocks(), checkIPBlock}, {"notRemoteIpBlocks", s.GetNotRemoteIpBlocks(), checkIPBlock},
	})
}

// authzList is one list field of a source or an operation, with the check of its values.
type authzList struct {
	name   string
	values []string
	check  func(string) error
}

// checkAuthzLists checks each list's values and that at least one list is set (what names
// the source or operation in the error).
func checkAuthzLists(p path, what string, lists []authzList) *FieldError {
	set := false
	for _, l := range lists {
		set = set || len(l.values) > 0
		if fe := checkAuthzValues(p.f(l.name), l.values, l.check); fe != nil {
			return fe
		}
	}
	if !set {
		return p.err("%s must set at least one field", what)
	}
	return nil
}

func validateAuthzOperation(p path, t *security.Rule_To) *FieldError {
	if t == nil || t.GetOperation() == nil {
		return p.f("operation").err("an operation is required")
	}
	o := t.GetOperation()
	p = p.f("operation")
	return checkAuthzLists(p, "an operation", []authzList{
		{"hosts", o.GetHosts(), nil}, {"notHosts", o.GetNotHosts(), nil},
		{"ports", o.GetPorts(), checkPort}, {"notPorts", o.GetNotPorts(), checkPort},
		{"methods", o.GetMethods(), nil}, {"notMethods", o.GetNotMethods(), nil},
		{"paths", o.GetPaths(), checkPath}, {"notPaths", o.GetNotPaths(), checkPath},
	})
}

func validateAuthzCondition(p path, c *security.Condition) *FieldError {
	if c == nil {
		return p.err("a condition must not be null")
	}
	key := c.GetKey()
	if key == "" {
		return p.f("key").err("a key is required")
	}
	var check func(string) error
	switch {
	case strings.HasPrefix(key, "request.headers"):
		name, ok := strings.CutPrefix(key, "request.headers[")
		if !ok || !strings.HasSuffix(name, "]") || len(name) < 2 {
			return p.f("key").err("%q should have the form request.headers[<name>]", key)
		}
	case strings.HasPrefix(key, "request.auth."):
		return p.f("key").unsupported("no RequestAuthentication, so requests carry no JWT claims")
	case strings.HasPrefix(key, "experimental.envoy.filters."):
		return p.f("key").unsupported("no Envoy dynamic metadata to match")
	case key == "source.ip" || key == "remote.ip" || key == "destination.ip":
		check = checkIPBlock
	case key == "destination.port":
		check = checkPort
	case key == "source.serviceAccount":
		check = checkServiceAccount
	case key == "source.trustDomain":
		check = checkWildcards
	case key == "destination.namespace" || strings.HasPrefix(key, "destination.labels"):
		return p.f("key").err("%q is replaced by the policy's namespace and workload selector", key)
	case !authzConditionKeys[key]:
		return p.f("key").err("unknown attribute %q", key)
	}
	if len(c.GetValues())+len(c.GetNotValues()) == 0 {
		return p.err("at least one of values or notValues is required for key %s", key)
	}
	return firstErr(checkAuthzValues(p.f("values"), c.GetValues(), check), checkAuthzValues(p.f("notValues"), c.GetNotValues(), check))
}

func checkAuthzValues(p path, values []string, check func(string) error) *FieldError {
	for i, v := range values {
		if v == "" {
			return p.idx(i).err("empty value")
		}
		if check != nil {
			if err := check(v); err != nil {
				return p.idx(i).wrap(err)
			}
		}
	}
	return nil
}

func checkIPBlock(v string) error {
	if strings.Contains(v, "/") {
		if _, err := netip.ParsePrefix(v); err != nil {
			return fmt.Errorf("bad CIDR range %q: %v", v, err)
		}
		return nil
	}
	if _, err := netip.ParseAddr(v); err != nil {
		return fmt.Errorf("bad IP address %q", v)
	}
	return nil
}

func checkPort(v string) error {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 || n > 65535 {
		return fmt.Errorf("bad port %q: want a number 1-65535", v)
	}
	return nil
}

func checkPath(v string) error {
	if strings.ContainsAny(v, "{}") {
		return fmt.Errorf("path %q: path templates ({*}, {**}) are not supported by wasmesh", v)
	}
	return nil
}

func checkServiceAccount(v string) error {
	if strings.Contains(v, "*") {
		return fmt.Errorf("service account %q: wildcards are not allowed", v)
	}
	if strings.Count(v, "/") > 1 {
		return fmt.Errorf("service account %q: want <name> or <namespace>/<name>", v)
	}
	return nil
}

func checkWildcards(v string) error {
	if strings.Count(v, "*") > 1 {
		return fmt.Errorf("%q: at most one wildcard is allowed", v)
	}
	return nil
}
