package config

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networking "istio.io/api/networking/v1alpha3"
)

func doc(kind, spec string) string {
	return fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: %s\nmetadata: {name: a, namespace: shop}\nspec:\n%s", kind, indent(spec))
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// Every traffic field that is wrong, or that wasmesh does not translate, is rejected with its
// path; nothing is silently ignored.
func TestTrafficValidationNamesTheField(t *testing.T) {
	const route = "route: [{destination: {host: r}}]"
	vs := func(http string) string { return doc("VirtualService", "hosts: [r]\nhttp:\n"+http) }
	dr := func(tp string) string { return doc("DestinationRule", "host: r\ntrafficPolicy:\n"+indent(tp)) }
	sc := func(spec string) string { return doc("Sidecar", spec) }
	cases := []struct {
		name, doc, field, message string
	}{
		// VirtualService
		{"vs star host", doc("VirtualService", "hosts: ['*']\nhttp: [{"+route+"}]"), "spec.hosts[0]", "not allowed"},
		{"vs bad host", doc("VirtualService", "hosts: ['a b']\nhttp: [{"+route+"}]"), "spec.hosts[0]", "invalid host"},
		{"vs no http", doc("VirtualService", "hosts: [r]"), "spec.http", "at least one"},
		{"vs tcp", doc("VirtualService", "hosts: [r]\ntcp: [{route: [{destination: {host: r}}]}]"), "spec.tcp", "not supported"},
		{"vs tls", doc("VirtualService", "hosts: [r]\ntls: [{match: [{sniHosts: [r]}], route: [{destination: {host: r}}]}]"), "spec.tls", "not supported"},
		{"vs bad gateway", doc("VirtualService", "hosts: [r]\ngateways: [A/B]\nhttp: [{"+route+"}]"), "spec.gateways[0]", "DNS"},
		{"vs exportTo", doc("VirtualService", "hosts: [r]\nexportTo: ['~', '*']\nhttp: [{"+route+"}]"), "spec.exportTo[0]", "cannot be combined"},
		{"delegate with gateways", doc("VirtualService", "gateways: [mesh]\nhttp: [{"+route+"}]"), "spec.gateways", "delegate"},
		{"no action", vs("- {match: [{uri: {prefix: /}}]}"), "spec.http[0]", "one of route"},
		{"two actions", vs("- {redirect: {uri: /x}, " + route + "}"), "spec.http[0]", "mutually exclusive"},
		{"empty uri match", vs("- {match: [{uri: {}}], " + route + "}"), "spec.http[0].match[0].uri", "one of exact"},
		{"bad uri regex", vs("- {match: [{uri: {regex: '('}}], " + route + "}"), "spec.http[0].match[0].uri.regex", "RE2"},
		{"star uri regex", vs("- {match: [{uri: {regex: '*'}}], " + route + "}"), "spec.http[0].match[0].uri.regex", "not a regular expression"},
		{"upper header", vs("- {match: [{headers: {X-User: {exact: a}}}], " + route + "}"), "spec.http[0].match[0].headers.X-User", "lower case"},
		{"jwt claim header", vs("- {match: [{headers: {'@request.auth.claims.group': {exact: a}}}], " + route + "}"), "spec.http[0].match[0].headers.@request.auth.claims.group", "not supported"},
		{"query prefix", vs("- {match: [{queryParams: {q: {prefix: a}}}], " + route + "}"), "spec.http[0].match[0].queryParams.q.prefix", "not supported"},
		{"match port", vs("- {match: [{port: 70000}], " + route + "}"), "spec.http[0].match[0].port", "out of range"},
		{"source namespace", vs("- {match: [{sourceNamespace: 'Bad_NS'}], " + route + "}"), "spec.http[0].match[0].sourceNamespace", "DNS"},
		{"no destination host", vs("- route: [{destination: {subset: v1}}]"), "spec.http[0].route[0].destination.host", "required"},
		{"wildcard destination", vs("- route: [{destination: {host: '*.example.com'}}]"), "spec.http[0].route[0].destination.host", "wildcard"},
		{"bad subset", vs("- route: [{destination: {host: r, subset: V_1}}]"), "spec.http[0].route[0].destination.subset", "DNS"},
		{"negative weight", vs("- route: [{destination: {host: r}, weight: -1}, {destination: {host: r}, weight: 2}]"), "spec.http[0].route[0].weight", "negative"},
		{"zero weights", vs("- route: [{destination: {host: r}}, {destination: {host: r, subset: b}}]"), "spec.http[0].route", "add up to 0"},
		{"redirect code", vs("- {redirect: {uri: /x, redirectCode: 300}}"), "spec.http[0].redirect.redirectCode", "300"},
		{"redirect uri and prefix", vs("- {redirect: {uri: /x, prefixRewrite: /y}}"), "spec.http[0].redirect", "mutually exclusive"},
		{"redirect scheme", vs("- {redirect: {scheme: ftp}}"), "spec.http[0].redirect.scheme", "ftp"},
		{"direct response status", vs("- {directResponse: {status: 99}}"), "spec.http[0].directResponse.status", "[200, 599]"},
		{"rewrite with redirect", vs("- {redirect: {uri: /x}, rewrite: {uri: /y}}"), "spec.http[0].rewrite", "only applies"},
		{"rewrite both", vs("- {rewrite: {uri: /y, uriRegexRewrite: {match: a, rewrite: b}}, " + route + "}"), "spec.http[0].rewrite", "mutually exclusive"},
		{"rewrite bad regex", vs("- {rewrite: {uriRegexRewrite: {match: '(', rewrite: b}}, " + route + "}"), "spec.http[0].rewrite.uriRegexRewrite.match", "RE2"},
		{"negative timeout", vs("- {timeout: -1s, " + route + "}"), "spec.http[0].timeout", "shorter"},
		{"retry attempts", vs("- {retries: {attempts: -1}, " + route + "}"), "spec.http[0].retries.attempts", "negative"},
		{"retry zero with fields", vs("- {retries: {attempts: 0, perTryTimeout: 1s}, " + route + "}"), "spec.http[0].retries.attempts", "disables"},
		{"retry per try", vs("- {retries: {attempts: 1, perTryTimeout: 0.0001s}, " + route + "}"), "spec.http[0].retries.perTryTimeout", "shorter"},
		{"retry on", vs("- {retries: {attempts: 1, retryOn: '5xx,sometimes'}, " + route + "}"), "spec.http[0].retries.retryOn", "sometimes"},
		{"retry backoff", vs("- {retries: {attempts: 1, backoff: 0s}, " + route + "}"), "spec.http[0].retries.backoff", "shorter"},
		{"empty fault", vs("- {fault: {}, " + route + "}"), "spec.http[0].fault", "one of delay or abort"},
		{"fault percentage", vs("- {fault: {abort: {httpStatus: 500, percentage: {value: 120}}}, " + route + "}"), "spec.http[0].fault.abort.percentage.value", "[0, 100]"},
		{"fault http status", vs("- {fault: {abort: {httpStatus: 700}}, " + route + "}"), "spec.http[0].fault.abort.httpStatus", "[200, 599]"},
		{"fault grpc status", vs("- {fault: {abort: {grpcStatus: NOPE}}, " + route + "}"), "spec.http[0].fault.abort.grpcStatus", "NOPE"},
		{"fault http2 error", vs("- {fault: {abort: {http2Error: REFUSED_STREAM}}, " + route + "}"), "spec.http[0].fault.abort.http2Error", "not supported"},
		{"fault exponential", vs("- {fault: {delay: {exponentialDelay: 1s}}, " + route + "}"), "spec.http[0].fault.delay.exponentialDelay", "not supported"},
		{"fault no delay", vs("- {fault: {delay: {percentage: {value: 1}}}, " + route + "}"), "spec.http[0].fault.delay.fixedDelay", "required"},
		{"fault delay percent", vs("- {fault: {delay: {fixedDelay: 1s, percent: 101}}, " + route + "}"), "spec.http[0].fault.delay.percent", "[0, 100]"},
		{"mirror and mirrors", vs("- {mirror: {host: m}, mirrors: [{destination: {host: m}}], " + route + "}"), "spec.http[0].mirrors", "mutually exclusive"},
		{"mirror percentage alone", vs("- {mirrorPercentage: {value: 5}, " + route + "}"), "spec.http[0].mirrorPercentage", "needs a mirror"},
		{"mirror percentage", vs("- {mirror: {host: m}, mirrorPercentage: {value: -1}, " + route + "}"), "spec.http[0].mirrorPercentage.value", "[0, 100]"},
		{"mirrors destination", vs("- {mirrors: [{percentage: {value: 1}}], " + route + "}"), "spec.http[0].mirrors[0].destination", "required"},
		{"cors method", vs("- {corsPolicy: {allowMethods: [FETCH]}, " + route + "}"), "spec.http[0].corsPolicy.allowMethods[0]", "FETCH"},
		{"cors max age", vs("- {corsPolicy: {maxAge: 1.5s}, " + route + "}"), "spec.http[0].corsPolicy.maxAge", "whole seconds"},
		{"cors origins", vs("- {corsPolicy: {allowOrigins: [{}]}, " + route + "}"), "spec.http[0].corsPolicy.allowOrigins[0]", "one of exact"},
		{"cors header", vs("- {corsPolicy: {allowHeaders: ['a b']}, " + route + "}"), "spec.http[0].corsPolicy.allowHeaders[0]", "not a valid header"},
		{"set pseudo header", vs("- {headers: {request: {set: {':path': /x}}}, " + route + "}"), "spec.http[0].headers.request.set.:path", "pseudo-header"},
		{"response authority", vs("- {headers: {response: {set: {host: x}}}, " + route + "}"), "spec.http[0].headers.response.set.host", "request header"},
		{"remove host", vs("- {headers: {request: {remove: [Host]}}, " + route + "}"), "spec.http[0].headers.request.remove[0]", "cannot be removed"},
		{"destination headers", vs("- route: [{destination: {host: r}, headers: {request: {add: {'bad header': x}}}}]"), "spec.http[0].route[0].headers.request.add.bad header", "not a valid header"},
		{"delegate without name", vs("- {delegate: {namespace: x}}"), "spec.http[0].delegate.name", "required"},
		{"nested delegate", doc("VirtualService", "http: [{delegate: {name: x}}]"), "spec.http[0].delegate", "cannot delegate"},

		// DestinationRule
		{"dr no host", doc("DestinationRule", "trafficPolicy: {loadBalancer: {simple: RANDOM}}"), "spec.host", "required"},
		{"dr star host", doc("DestinationRule", "host: '*'"), "spec.host", "not allowed"},
		{"dr subset name", doc("DestinationRule", "host: r\nsubsets: [{name: V1}]"), "spec.subsets[0].name", "DNS"},
		{"dr duplicate subset", doc("DestinationRule", "host: r\nsubsets: [{name: a}, {name: a}]"), "spec.subsets[1].name", "duplicate"},
		{"dr subset policy", doc("DestinationRule", "host: r\nsubsets: [{name: a, trafficPolicy: {outlierDetection: {interval: 0s}}}]"), "spec.subsets[0].trafficPolicy.outlierDetection.interval", "shorter"},
		{"dr selector", doc("DestinationRule", "host: r\nworkloadSelector: {}\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}"), "spec.workloadSelector.matchLabels", "at least one"},
		{"dr empty policy", dr("{}"), "spec.trafficPolicy", "at least one"},
		{"dr tunnel", dr("tunnel: {protocol: CONNECT, targetHost: a, targetPort: 80}"), "spec.trafficPolicy.tunnel", "not supported"},
		{"dr hash key", dr("loadBalancer: {consistentHash: {minimumRingSize: 1}}"), "spec.trafficPolicy.loadBalancer.consistentHash", "one of"},
		{"dr cookie", dr("loadBalancer: {consistentHash: {httpCookie: {ttl: 1s}}}"), "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.name", "required"},
		{"dr maglev", dr("loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 100}}}"), "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize", "prime"},
		{"dr source ip false", dr("loadBalancer: {consistentHash: {useSourceIp: false}}"), "spec.trafficPolicy.loadBalancer.consistentHash.useSourceIp", "true"},
		{"dr zone aware", dr("loadBalancer: {zoneAwareLbSetting: {enabled: true}}"), "spec.trafficPolicy.loadBalancer.zoneAwareLbSetting", "not supported"},
		{"dr warmup random", dr("loadBalancer: {simple: RANDOM, warmup: {duration: 10s}}"), "spec.trafficPolicy.loadBalancer.warmup", "ROUND_ROBIN and LEAST_REQUEST"},
		{"dr warmup aggression", dr("loadBalancer: {warmup: {duration: 10s, aggression: 0.5}}"), "spec.trafficPolicy.loadBalancer.warmup.aggression", "at least 1"},
		{"dr distribute and failover", dr("loadBalancer: {localityLbSetting: {distribute: [{from: a, to: {b: 100}}], failover: [{from: a, to: b}]}}"), "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute", "mutually exclusive"},
		{"dr distribute sum", dr("loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {b: 60, c: 30}}]}}"), "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to", "add up to 90"},
		{"dr failover same", dr("loadBalancer: {localityLbSetting: {failover: [{from: a, to: a}]}}"), "spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0]", "same region"},
		{"dr failover zone", dr("loadBalancer: {localityLbSetting: {failover: [{from: a/z, to: b}]}}"), "spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0].from", "region"},
		{"dr empty pool", dr("connectionPool: {}"), "spec.trafficPolicy.connectionPool", "one of tcp or http"},
		{"dr max connections", dr("connectionPool: {tcp: {maxConnections: -1}}"), "spec.trafficPolicy.connectionPool.tcp.maxConnections", "negative"},
		{"dr connect timeout", dr("connectionPool: {tcp: {connectTimeout: 0s}}"), "spec.trafficPolicy.connectionPool.tcp.connectTimeout", "shorter"},
		{"dr keepalive", dr("connectionPool: {tcp: {tcpKeepalive: {time: 0.5s}}}"), "spec.trafficPolicy.connectionPool.tcp.tcpKeepalive.time", "shorter"},
		{"dr http limits", dr("connectionPool: {http: {http2MaxRequests: -5}}"), "spec.trafficPolicy.connectionPool.http.http2MaxRequests", "negative"},
		{"dr h2 keepalive", dr("connectionPool: {http: {http2KeepAlive: {timeout: 1s}}}"), "spec.trafficPolicy.connectionPool.http.http2KeepAlive.interval", "required"},
		{"dr consecutive errors", dr("outlierDetection: {consecutiveErrors: 5}"), "spec.trafficPolicy.outlierDetection.consecutiveErrors", "deprecated"},
		{"dr error codes", dr("outlierDetection: {outlierDetectionHttpErrorCodes: [500]}"), "spec.trafficPolicy.outlierDetection.outlierDetectionHttpErrorCodes", "not supported"},
		{"dr ejection percent", dr("outlierDetection: {maxEjectionPercent: 101}"), "spec.trafficPolicy.outlierDetection.maxEjectionPercent", "[0, 100]"},
		{"dr local origin", dr("outlierDetection: {consecutiveLocalOriginFailures: 3}"), "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures", "splitExternalLocalOriginErrors"},
		{"dr credential name", dr("tls: {mode: SIMPLE, credentialName: cert}"), "spec.trafficPolicy.tls.credentialName", "not supported"},
		{"dr istio mutual files", dr("tls: {mode: ISTIO_MUTUAL, caCertificates: /ca.pem}"), "spec.trafficPolicy.tls.caCertificates", "ISTIO_MUTUAL"},
		{"dr mutual without cert", dr("tls: {mode: MUTUAL, privateKey: /k.pem}"), "spec.trafficPolicy.tls.clientCertificate", "MUTUAL needs"},
		{"dr simple with cert", dr("tls: {mode: SIMPLE, clientCertificate: /c.pem}"), "spec.trafficPolicy.tls.clientCertificate", "SIMPLE"},
		{"dr disable with sni", dr("tls: {mode: DISABLE, sni: a}"), "spec.trafficPolicy.tls.mode", "DISABLE"},
		{"dr skip verify", dr("tls: {mode: SIMPLE, insecureSkipVerify: true, caCertificates: /ca.pem}"), "spec.trafficPolicy.tls.insecureSkipVerify", "contradicts"},
		{"dr retry budget", dr("retryBudget: {percent: 150}"), "spec.trafficPolicy.retryBudget.percent", "[0, 100]"},
		{"dr retry budget interval", dr("retryBudget: {budgetInterval: 1s}"), "spec.trafficPolicy.retryBudget.budgetInterval", "not supported"},
		{"dr port level port", dr("portLevelSettings: [{loadBalancer: {simple: RANDOM}}]"), "spec.trafficPolicy.portLevelSettings[0].port", "required"},
		{"dr port level empty", dr("portLevelSettings: [{port: {number: 80}}]"), "spec.trafficPolicy.portLevelSettings[0]", "at least one"},
		{"dr port level duplicate", dr("portLevelSettings: [{port: {number: 80}, loadBalancer: {simple: RANDOM}}, {port: {number: 80}, loadBalancer: {simple: RANDOM}}]"), "spec.trafficPolicy.portLevelSettings[1].port.number", "duplicate"},
		{"dr port level nested", dr("portLevelSettings: [{port: {number: 80}, tls: {mode: MUTUAL}}]"), "spec.trafficPolicy.portLevelSettings[0].tls.clientCertificate", "MUTUAL needs"},
		{"dr exportTo", doc("DestinationRule", "host: r\nexportTo: [Bad]\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}"), "spec.exportTo[0]", "DNS"},

		// Sidecar
		{"sidecar selector", sc("workloadSelector: {}"), "spec.workloadSelector.labels", "at least one"},
		{"sidecar egress host", sc("egress: [{hosts: [reviews]}]"), "spec.egress[0].hosts[0]", "namespace/host"},
		{"sidecar egress namespace", sc("egress: [{hosts: [Bad/x]}]"), "spec.egress[0].hosts[0]", "DNS"},
		{"sidecar no hosts", sc("egress: [{port: {number: 80}}]"), "spec.egress[0].hosts", "at least one"},
		{"sidecar two catch-alls", sc("egress: [{hosts: ['./*']}, {hosts: ['*/*']}]"), "spec.egress[1].port", "only one"},
		{"sidecar duplicate egress port", sc("egress: [{port: {number: 80}, hosts: ['./*']}, {port: {number: 80}, hosts: ['*/*']}]"), "spec.egress[1].port.number", "duplicate"},
		{"sidecar egress protocol", sc("egress: [{port: {number: 80, protocol: SPDY}, hosts: ['./*']}]"), "spec.egress[0].port.protocol", "SPDY"},
		{"sidecar egress bind", sc("egress: [{port: {number: 80}, bind: nowhere, hosts: ['./*']}]"), "spec.egress[0].bind", "not an IP"},
		{"sidecar capture none", sc("egress: [{port: {number: 80}, captureMode: NONE, hosts: ['./*']}]"), "spec.egress[0].bind", "needs a bind"},
		{"sidecar catch-all bind", sc("egress: [{bind: 127.0.0.2, hosts: ['./*']}]"), "spec.egress[0].bind", "need a port"},
		{"sidecar ingress port", sc("ingress: [{defaultEndpoint: 127.0.0.1:8080}]"), "spec.ingress[0].port", "required"},
		{"sidecar ingress tls", sc("ingress: [{port: {number: 80}, tls: {mode: SIMPLE}}]"), "spec.ingress[0].tls", "not supported"},
		{"sidecar ingress endpoint", sc("ingress: [{port: {number: 80}, defaultEndpoint: 10.0.0.1:8080}]"), "spec.ingress[0].defaultEndpoint", "loopback"},
		{"sidecar ingress unix", sc("ingress: [{port: {number: 80}, defaultEndpoint: 'unix:///var/run/app.sock'}]"), "spec.ingress[0].defaultEndpoint", "not supported"},
		{"sidecar ingress target port", sc("ingress: [{port: {number: 80, targetPort: 8080}}]"), "spec.ingress[0].port.targetPort", "not used"},
		{"sidecar ingress duplicate", sc("ingress: [{port: {number: 80}}, {port: {number: 80}}]"), "spec.ingress[1].port.number", "duplicate"},
		{"sidecar egress proxy mode", sc("outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: egress.example.com, port: {number: 80}}}"), "spec.outboundTrafficPolicy.egressProxy", "ALLOW_ANY"},
		{"sidecar egress proxy port", sc("outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.example.com}}"), "spec.outboundTrafficPolicy.egressProxy.port", "required"},
		{"sidecar inbound pool", sc("inboundConnectionPool: {tcp: {maxConnections: -1}}"), "spec.inboundConnectionPool.tcp.maxConnections", "negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs := ParseFile("bad.yaml", []byte(tc.doc))
			require.Len(t, docs, 1)
			require.NotNil(t, docs[0].Err, "accepted:\n%s", tc.doc)
			assert.Equal(t, tc.field, docs[0].Err.Field, "%v", docs[0].Err)
			assert.Contains(t, docs[0].Err.Error(), tc.message)
		})
	}
}

// A configuration using every translated field parses, with Go-style durations.
func TestTrafficValidationAcceptsIstioExamples(t *testing.T) {
	docs := ParseFile("good.yaml", []byte(doc("VirtualService", `
hosts: [reviews, "*.example.com"]
gateways: [mesh]
exportTo: [".", other]
http:
- name: all
  match:
  - name: m
    uri: {prefix: /a}
    scheme: {exact: http}
    method: {exact: GET}
    authority: {regex: ".*"}
    headers: {x-a: {exact: b}, x-present: {}}
    withoutHeaders: {x-debug: {prefix: "1"}}
    queryParams: {q: {regex: "[a-z]+"}, p: {}}
    port: 9080
    sourceLabels: {app: web}
    sourceNamespace: web
    ignoreUriCase: true
    statPrefix: a
  route:
  - {destination: {host: reviews, subset: v1, port: {number: 9080}}, weight: 90, headers: {request: {set: {x-a: b}}}}
  - {destination: {host: reviews, subset: v2}, weight: 10}
  rewrite: {uri: /b, authority: reviews.internal}
  timeout: 1m30s
  retries: {attempts: 3, perTryTimeout: 250ms, retryOn: "5xx,503,unavailable", retryRemoteLocalities: true, retryIgnorePreviousHosts: false, backoff: 25ms}
  fault: {delay: {fixedDelay: 100ms, percentage: {value: 0.5}}, abort: {grpcStatus: UNAVAILABLE, percentage: {value: 1}}}
  mirror: {host: shadow}
  mirrorPercentage: {value: 12.5}
  corsPolicy: {allowOrigins: [{exact: "https://a"}], allowMethods: [GET], allowHeaders: [x-a], exposeHeaders: [x-b], maxAge: 24h, allowCredentials: true}
  headers: {request: {set: {host: a}, add: {x-c: d}, remove: [x-e]}, response: {set: {x-f: g}}}
- directResponse: {status: 404, body: {string: "no"}}
`)+"---\n"+doc("DestinationRule", `
host: reviews
exportTo: ["*"]
trafficPolicy:
  loadBalancer: {simple: LEAST_REQUEST, warmup: {duration: 1m, minimumPercent: 10, aggression: 1.5}, localityLbSetting: {failover: [{from: us-east, to: us-west}], failoverPriority: [topology.istio.io/network]}}
  connectionPool: {tcp: {maxConnections: 1, connectTimeout: 100ms, tcpKeepalive: {time: 2h, interval: 75s, probes: 9}, maxConnectionDuration: 1h, idleTimeout: 5m}, http: {http1MaxPendingRequests: 1, http2MaxRequests: 1, maxRequestsPerConnection: 1, maxRetries: 1, idleTimeout: 1m, h2UpgradePolicy: UPGRADE, maxConcurrentStreams: 10, http2KeepAlive: {interval: 30s, timeout: 5s}}}
  outlierDetection: {consecutive5xxErrors: 1, consecutiveGatewayErrors: 1, interval: 1s, baseEjectionTime: 30s, maxEjectionPercent: 100, minHealthPercent: 0, splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 2}
  tls: {mode: SIMPLE, caCertificates: /ca.pem, sni: a, subjectAltNames: [a]}
  proxyProtocol: {version: V1}
  retryBudget: {percent: 20, minRetryConcurrency: 3}
  portLevelSettings: [{port: {number: 9080}, loadBalancer: {consistentHash: {httpCookie: {name: c, ttl: 0s}}}}]
subsets: [{name: v1, labels: {version: v1}, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}]
`)+"---\n"+doc("Sidecar", `
workloadSelector: {labels: {app: web}}
ingress: [{port: {number: 9080, protocol: HTTP, name: http}, defaultEndpoint: 127.0.0.1:8080, connectionPool: {http: {http1MaxPendingRequests: 5}}}]
egress:
- {port: {number: 9080, protocol: HTTP, name: http}, hosts: [./reviews.shop.svc.cluster.local]}
- {hosts: ["./*", "istio-system/*", "~/*"]}
outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.example.com, port: {number: 3128}}}
inboundConnectionPool: {tcp: {maxConnections: 100}}
`)))
	require.Len(t, docs, 3)
	for _, d := range docs {
		require.Nil(t, d.Err, "%v", d.Err)
	}
	spec := docs[0].Config.Spec.(*networking.VirtualService)
	assert.Equal(t, 90*time.Second, spec.GetHttp()[0].GetTimeout().AsDuration(), "Go durations are read")
	assert.Equal(t, 250*time.Millisecond, spec.GetHttp()[0].GetRetries().GetPerTryTimeout().AsDuration())
	assert.Equal(t, 2*time.Hour, docs[1].Config.Spec.(*networking.DestinationRule).GetTrafficPolicy().GetConnectionPool().GetTcp().GetTcpKeepalive().GetTime().AsDuration())
}

func TestGoDurations(t *testing.T) {
	for in, want := range map[string]string{"50ms": "0.05s", "1m30s": "90s", "24h": "86400s", "-1500ms": "-1.5s", "1us": "0.000001s"} {
		got, ok := goDuration(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"1s", "0.5s", "-1.5s", "soon"} {
		_, ok := goDuration(in)
		assert.False(t, ok, "%s is left to protojson", in)
	}
}
