package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const apHeader = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ap, namespace: default}
`

func TestAuthorizationPolicyRejections(t *testing.T) {
	runRejections(t, apHeader, []extCase{
		{"custom without provider", `spec: {action: CUSTOM, rules: [{}]}`, "spec.provider.name", "provider name"},
		{"custom", `spec: {action: CUSTOM, provider: {name: ext}, rules: [{}]}`, "spec.action", "not supported"},
		{"provider on allow", `spec: {provider: {name: ext}, rules: [{}]}`, "spec.provider", "only for the CUSTOM"},
		{"deny without rules", `spec: {action: DENY}`, "spec.rules", "never matches"},
		{"targetRefs", `spec: {targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: gw}]}`, "spec.targetRefs", "not supported"},
		{"from without source", `spec: {rules: [{from: [{}]}]}`, "spec.rules[0].from[0].source", "required"},
		{"empty source", `spec: {rules: [{from: [{source: {}}]}]}`, "spec.rules[0].from[0].source", "at least one field"},
		{"empty principal", `spec: {rules: [{from: [{source: {principals: [""]}}]}]}`, "spec.rules[0].from[0].source.principals[0]", "empty value"},
		{"bad ip block", `spec: {rules: [{from: [{source: {ipBlocks: ["10.0.0.0/33"]}}]}]}`, "spec.rules[0].from[0].source.ipBlocks[0]", "bad CIDR"},
		{"bad remote ip", `spec: {rules: [{from: [{source: {notRemoteIpBlocks: ["1.2.3"]}}]}]}`, "spec.rules[0].from[0].source.notRemoteIpBlocks[0]", "bad IP address"},
		{"request principals", `spec: {rules: [{from: [{source: {requestPrincipals: ["*"]}}]}]}`, "spec.rules[0].from[0].source.requestPrincipals", "not supported"},
		{"service accounts with principals", `spec: {rules: [{from: [{source: {serviceAccounts: [a], principals: [b]}}]}]}`, "spec.rules[0].from[0].source.serviceAccounts", "cannot be set"},
		{"empty operation", `spec: {rules: [{to: [{operation: {}}]}]}`, "spec.rules[0].to[0].operation", "at least one field"},
		{"port zero", `spec: {rules: [{to: [{operation: {ports: ["0"]}}]}]}`, "spec.rules[0].to[0].operation.ports[0]", "1-65535"},
		{"port too big", `spec: {rules: [{to: [{operation: {notPorts: ["65536"]}}]}]}`, "spec.rules[0].to[0].operation.notPorts[0]", "1-65535"},
		{"port not a number", `spec: {rules: [{to: [{operation: {ports: ["http"]}}]}]}`, "spec.rules[0].to[0].operation.ports[0]", "bad port"},
		{"empty method", `spec: {rules: [{to: [{operation: {methods: [GET, ""]}}]}]}`, "spec.rules[0].to[0].operation.methods[1]", "empty value"},
		{"path template", `spec: {rules: [{to: [{operation: {paths: ["/a/{*}"]}}]}]}`, "spec.rules[0].to[0].operation.paths[0]", "templates"},
		{"unknown key", `spec: {rules: [{when: [{key: source.user, values: [x]}]}]}`, "spec.rules[0].when[0].key", "unknown attribute"},
		{"empty key", `spec: {rules: [{when: [{values: [x]}]}]}`, "spec.rules[0].when[0].key", "required"},
		{"no values", `spec: {rules: [{when: [{key: source.ip}]}]}`, "spec.rules[0].when[0]", "values or notValues"},
		{"header key without name", `spec: {rules: [{when: [{key: "request.headers[]", values: [x]}]}]}`, "spec.rules[0].when[0].key", "request.headers[<name>]"},
		{"jwt claims", `spec: {rules: [{when: [{key: "request.auth.claims[iss]", values: [x]}]}]}`, "spec.rules[0].when[0].key", "not supported"},
		{"destination labels", `spec: {rules: [{when: [{key: "destination.labels[app]", values: [x]}]}]}`, "spec.rules[0].when[0].key", "workload selector"},
		{"bad destination port", `spec: {rules: [{when: [{key: destination.port, notValues: ["70000"]}]}]}`, "spec.rules[0].when[0].notValues[0]", "1-65535"},
		{"bad source ip", `spec: {rules: [{when: [{key: source.ip, values: ["x"]}]}]}`, "spec.rules[0].when[0].values[0]", "bad IP"},
		{"empty when value", `spec: {rules: [{when: [{key: connection.sni, values: [""]}]}]}`, "spec.rules[0].when[0].values[0]", "empty value"},
	})
}

func TestAuthorizationPolicyAccepted(t *testing.T) {
	for _, doc := range []string{
		`spec: {}`,
		`spec: {action: AUDIT, rules: [{}]}`,
		`spec: {action: DENY, rules: [{}]}`,
		`
spec:
  selector: {matchLabels: {app: web}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/a/sa/b", "*"], notNamespaces: [kube-*], ipBlocks: ["10.0.0.0/8", "::1"]}}]
    to: [{operation: {hosts: ["*.example.com"], methods: [GET], paths: ["/api/*"], ports: ["8080"]}}]
    when:
    - {key: "request.headers[x-user]", values: [alice]}
    - {key: source.ip, notValues: ["192.168.0.0/16"]}
    - {key: destination.port, values: ["8080"]}
    - {key: connection.sni, values: ["*.local"]}
    - {key: source.principal, values: ["*"]}
    - {key: source.namespace, values: [default]}
    - {key: remote.ip, values: ["1.2.3.4"]}
    - {key: destination.ip, values: ["10.0.0.1"]}
`,
	} {
		docs := ParseFile("ap.yaml", []byte(apHeader+doc))
		require.Len(t, docs, 1)
		assert.Nil(t, docs[0].Err, doc)
	}
}
