package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// fuzzSeeds holds one valid document of every kind the parser accepts (the corpus under
// testdata/fuzz/FuzzParseDocument carries the same, and broken variants).
var fuzzSeeds = map[Kind]string{
	ServiceEntry: "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: ns1}\n" +
		"spec:\n  hosts: [api.example.com]\n  ports: [{number: 443, name: https, protocol: TLS}]\n  resolution: DNS\n  location: MESH_EXTERNAL\n",
	WorkloadEntry: "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm1}\n" +
		"spec:\n  address: 10.0.0.7\n  labels: {app: vm}\n  ports: {http: 8080}\n",
	WorkloadGroup: "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: vms}\n" +
		"spec:\n  metadata: {labels: {app: vm}}\n  template: {ports: {http: 8080}}\n",
	VirtualService: "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews}\n" +
		"spec:\n  hosts: [reviews]\n  http:\n  - timeout: 2s\n    retries: {attempts: 3, perTryTimeout: 500ms}\n    route:\n    - destination: {host: reviews, subset: v1}\n      weight: 100\n",
	DestinationRule: "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews}\n" +
		"spec:\n  host: reviews\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 10}}}\n  subsets: [{name: v1, labels: {version: v1}}]\n",
	Gateway: "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw}\n" +
		"spec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n",
	Sidecar: "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: ns1}\n" +
		"spec:\n  egress: [{hosts: ['./*', 'istio-system/*']}]\n",
	EnvoyFilter: "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: ef}\n" +
		"spec:\n  configPatches:\n  - applyTo: CLUSTER\n    match: {context: SIDECAR_OUTBOUND}\n    patch: {operation: MERGE, value: {connect_timeout: 3s}}\n",
	ProxyConfig: "apiVersion: networking.istio.io/v1beta1\nkind: ProxyConfig\nmetadata: {name: pc}\n" +
		"spec:\n  concurrency: 2\n  environmentVariables: {A: b}\n",
	WasmPlugin: "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: wp}\n" +
		"spec:\n  url: file:///opt/filters/telemetry.wasm\n  phase: STATS\n  pluginConfig: {a: 1}\n",
	Telemetry: "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh-default, namespace: istio-system}\n" +
		"spec:\n  metrics: [{providers: [{name: prometheus}], overrides: [{tagOverrides: {request_protocol: {operation: REMOVE}}}]}]\n",
	AuthorizationPolicy: "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow}\n" +
		"spec:\n  action: ALLOW\n  rules: [{from: [{source: {principals: ['cluster.local/ns/default/sa/a']}}], to: [{operation: {methods: [GET]}}]}]\n",
	PeerAuthentication: "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default}\n" +
		"spec:\n  mtls: {mode: STRICT}\n",
	RequestAuthentication: "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt}\n" +
		"spec:\n  jwtRules: [{issuer: 'https://issuer.example', jwksUri: 'https://issuer.example/jwks'}]\n",
}

// TestFuzzSeedsAreValid pins that every seed parses, so the fuzzer starts from accepted
// documents of every kind.
func TestFuzzSeedsAreValid(t *testing.T) {
	for _, k := range Kinds() {
		src, ok := fuzzSeeds[k]
		if !ok {
			t.Errorf("no fuzz seed for kind %s", k)
			continue
		}
		docs := ParseFile("seed.yaml", []byte(src))
		if len(docs) != 1 || docs[0].Config == nil {
			t.Errorf("seed for %s is rejected: %+v", k, docs)
		}
	}
}

// FuzzParseDocument feeds a file's bytes to ParseFile, the function the directory source
// turns YAML into validated configs with: it never panics, every rejection names the file,
// the document and what is wrong, and parsing is deterministic.
func FuzzParseDocument(f *testing.F) {
	for _, k := range Kinds() {
		f.Add([]byte(fuzzSeeds[k]))
	}
	samples, _ := filepath.Glob("../../testenv/samples/*/*.yaml")
	for _, s := range samples {
		if b, err := os.ReadFile(s); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const file = "fuzz.yaml"
		first := ParseFile(file, data)
		for _, d := range first {
			checkDocument(t, file, d)
		}
		again := ParseFile(file, data)
		if len(again) != len(first) {
			t.Fatalf("second parse gave %d documents, first %d", len(again), len(first))
		}
		for i := range first {
			sameDocument(t, first[i], again[i])
		}
	})
}

func checkDocument(t *testing.T, file string, d Document) {
	t.Helper()
	if (d.Config == nil) == (d.Err == nil) {
		t.Fatalf("document %d: want exactly one of config and error, got %+v", d.Index, d)
	}
	if d.Index < 1 {
		t.Fatalf("document index %d, want >= 1", d.Index)
	}
	if d.Err == nil {
		if d.Config.Source != DocumentSource(file, d.Index) {
			t.Fatalf("config source %q, want %q", d.Config.Source, DocumentSource(file, d.Index))
		}
		return
	}
	if d.Err.Err == nil || strings.TrimSpace(d.Err.Err.Error()) == "" {
		t.Fatalf("document %d: rejected without a reason: %+v", d.Index, d.Err)
	}
	msg := d.Err.Error()
	if d.Err.File != file || d.Err.Doc != d.Index || !strings.HasPrefix(msg, file+": document ") {
		t.Fatalf("error does not name its file and document: %q", msg)
	}
}

func sameDocument(t *testing.T, a, b Document) {
	t.Helper()
	if (a.Err == nil) != (b.Err == nil) || a.Index != b.Index || !reflect.DeepEqual(a.Key, b.Key) {
		t.Fatalf("nondeterministic parse: %+v then %+v", a, b)
	}
	if a.Err != nil {
		if a.Err.Error() != b.Err.Error() {
			t.Fatalf("nondeterministic error: %q then %q", a.Err, b.Err)
		}
		return
	}
	if !reflect.DeepEqual(a.Config.Meta, b.Config.Meta) || !proto.Equal(a.Config.Spec, b.Config.Spec) {
		t.Fatalf("accepted document parsed differently twice: %+v / %+v", a.Config, b.Config)
	}
}
