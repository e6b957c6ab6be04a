package discovery_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
)

// Three ServiceEntries define reviews.default.svc.cluster.local: a (first by namespace and
// name), b, and c, which also defines a host of its own.
const (
	seA = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: default}
spec: {hosts: [reviews.default.svc.cluster.local], resolution: STATIC, ports: [{number: 9080, name: http}]}
`
	seB = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: default}
spec: {hosts: [reviews.default.svc.cluster.local], resolution: STATIC, ports: [{number: 9081, name: http}]}
`
	seC = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: c, namespace: default}
spec: {hosts: [details.default.svc.cluster.local, reviews.default.svc.cluster.local], resolution: STATIC, ports: [{number: 9082, name: http}]}
`
)

type docStatus struct{ File, Config, Status, Error string }

func configzDocuments(t *testing.T, e *env) map[string]docStatus {
	t.Helper()
	var out struct {
		Documents []docStatus `json:"documents"`
	}
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/configz")), &out))
	byConfig := map[string]docStatus{}
	for _, d := range out.Documents {
		byConfig[d.Config] = d
	}
	return byConfig
}

// TestConfigzSaysWhichServiceEntryLosesADuplicateHost: of ServiceEntries defining the same
// host the first by namespace and name is in force; /debug/configz says the others are not
// (or only partly), naming the one that holds the host.
func TestConfigzSaysWhichServiceEntryLosesADuplicateHost(t *testing.T) {
	e := start(t, map[string]string{"shared.yaml": seA + "---" + seB + "---" + seC}, nil)
	docs := configzDocuments(t, e)
	assert.Equal(t, docStatus{File: "shared.yaml", Config: "ServiceEntry default/a", Status: "applied"}, docs["ServiceEntry default/a"])
	assert.Equal(t, docStatus{File: "shared.yaml", Config: "ServiceEntry default/b", Status: "ignored",
		Error: "host reviews.default.svc.cluster.local is already defined by ServiceEntry default/a (the first by namespace and name wins)"},
		docs["ServiceEntry default/b"])
	assert.Equal(t, docStatus{File: "shared.yaml", Config: "ServiceEntry default/c", Status: "partly applied",
		Error: "host reviews.default.svc.cluster.local is already defined by ServiceEntry default/a (the first by namespace and name wins)"},
		docs["ServiceEntry default/c"])

	// a goes: b holds the host now, and c still loses it, to b.
	e.write("shared.yaml", seB+"---"+seC)
	docs = configzDocuments(t, e)
	assert.NotContains(t, docs, "ServiceEntry default/a")
	assert.Equal(t, "applied", docs["ServiceEntry default/b"].Status)
	assert.Empty(t, docs["ServiceEntry default/b"].Error)
	assert.Equal(t, "partly applied", docs["ServiceEntry default/c"].Status)
	assert.Contains(t, docs["ServiceEntry default/c"].Error, "already defined by ServiceEntry default/b")
}

// TestRegistryzHasOneKeyPerField: every key of /debug/registryz is lowerCamelCase, as on the
// other debug pages, and no two keys of an object differ only by case; the resolution is
// Istio's name for it.
func TestRegistryzHasOneKeyPerField(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, hasEndpointIP(frontendCluster, "127.10.0.1"))

	var page map[string]any
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/registryz")), &page))
	checkKeys(t, "registryz", page)

	svcs, _ := page["services"].([]any)
	require.Len(t, svcs, 2)
	for _, s := range svcs {
		svc := s.(map[string]any)
		assert.Equal(t, "STATIC", svc["resolution"], "%v", svc["hostname"])
	}
	backend := svcs[0].(map[string]any)
	require.Equal(t, "backend.demo.svc.cluster.local", backend["hostname"])
	assert.Equal(t, []any{map[string]any{"name": "http", "port": 9081.0, "targetPort": 8081.0, "protocol": "HTTP"}}, backend["ports"])
	frontend := svcs[1].(map[string]any)
	eps, _ := frontend["endpoints"].([]any)
	require.Len(t, eps, 1)
	assert.Equal(t, "127.10.0.1", eps[0].(map[string]any)["address"])
	workloads, _ := page["workloads"].([]any)
	require.Len(t, workloads, 1)
	assert.Equal(t, "frontend-1", workloads[0].(map[string]any)["name"])
}

// /debug/endpointz is the latest snapshot's services and endpoints, what proxies are sent:
// the endpoint a proxy received is there, under the version of the latest push.
func TestEndpointzIsTheSnapshot(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, hasEndpointIP(frontendCluster, "127.10.0.1"))

	var page struct {
		Version  string
		Services []struct {
			Hostname  string
			Endpoints []struct{ Address string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/endpointz")), &page))
	assert.Equal(t, e.d.Pusher.Snapshot().Version, page.Version)
	require.Len(t, page.Services, 2)
	assert.Equal(t, "frontend.demo.svc.cluster.local", page.Services[1].Hostname)
	require.Len(t, page.Services[1].Endpoints, 1)
	assert.Equal(t, "127.10.0.1", page.Services[1].Endpoints[0].Address)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/endpointz")), &raw))
	checkKeys(t, "endpointz", raw)
}

// checkKeys walks a decoded JSON value: no object has two keys equal but for case, and every
// key starts in lower case, but for user data (labels, selectors, named ports).
func checkKeys(t *testing.T, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		seen := map[string]string{}
		for k, child := range v {
			if other, dup := seen[strings.ToLower(k)]; dup {
				t.Errorf("%s: keys %q and %q differ only by case", path, other, k)
			}
			seen[strings.ToLower(k)] = k
			if r := []rune(k); !unicode.IsLower(r[0]) {
				t.Errorf("%s: key %q does not start in lower case", path, k)
			}
			switch _, isMap := child.(map[string]any); {
			case isMap && (k == "labels" || k == "workloadSelector" || k == "ports"):
				// user data: label keys and port names are the user's
			default:
				checkKeys(t, path+"."+k, child)
			}
		}
	case []any:
		for i, child := range v {
			checkKeys(t, path+"["+strconv.Itoa(i)+"]", child)
		}
	}
}
