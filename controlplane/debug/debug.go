// Package debug serves discovery's introspection over HTTP: readiness, per-proxy sync
// state, configs and their status, the registry, generated config per proxy, the latest
// push, and Prometheus metrics under Istio's names.
package debug

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source/filedir"
	"github.com/wasmesh/wasmesh/controlplane/source/kube"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Deps are what the endpoints read.
type Deps struct {
	// Pusher decides what to send (snapshots, pushes); Server sends it (connections).
	Pusher *pusher.Pusher
	Server *server.Server
	// Configs lists the configs in force; Documents the directory's documents and their
	// status (may be nil).
	Configs   pusher.ConfigStore
	Documents func() []filedir.DocStatus
	// Objects lists the Kubernetes Istio objects and their status (may be nil).
	Objects  func() []kube.ObjectStatus
	Mesh     *mesh.Watcher // may be nil
	Registry registry.Registry
	// Workloads lists auto-registered workloads; may be nil.
	Workloads func() []*model.Workload
	Gatherer  prometheus.Gatherer
	// NotInForce, when set, says which ServiceEntries the registry holds only partly or not
	// at all (another defines their hosts first); /debug/configz reports their documents so.
	NotInForce func() map[config.Key]registry.NotInForce
	// Extensions, when set, reports the state of extension configs (EnvoyFilter patches not
	// applied, Wasm modules) in /debug/configz.
	Extensions func() any
	// Instance names this discovery replica (its Lease identity: POD_NAME or the hostname)
	// on /debug/syncz, as istioctl proxy-status's ISTIOD column.
	Instance string
}

// Handler returns the debug mux.
func Handler(d Deps) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		if !d.Server.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/debug/syncz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, syncz(d)) })
	mux.HandleFunc("/debug/configz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, configz(d)) })
	mux.HandleFunc("/debug/registryz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, registryz(d)) })
	mux.HandleFunc("/debug/endpointz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, endpointz(d)) })
	mux.HandleFunc("/debug/push_status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, pushStatus(d)) })
	mux.HandleFunc("/debug/config_dump", func(w http.ResponseWriter, r *http.Request) { configDump(d, w, r) })
	if d.Gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(d.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// SyncStatus is one connection in /debug/syncz: who the proxy is (what meshctl needs to
// find its pod and admin), which replica serves it, and per type what was sent, acked and
// NACKed.
type SyncStatus struct {
	ProxyID      string `json:"proxy"`
	ConnectionID string `json:"connectionId"`
	// Discovery is the replica serving the connection (Deps.Instance).
	Discovery string `json:"discovery,omitempty"`
	// Name and Namespace are the pod's; IPs its addresses; Localhost its pod localhost,
	// where its admin listens (docs/contracts.md).
	Name         string   `json:"name"`
	Namespace    string   `json:"namespace"`
	IPs          []string `json:"ips,omitempty"`
	Localhost    string   `json:"localhost,omitempty"`
	ClusterID    string   `json:"clusterId,omitempty"`
	IstioVersion string   `json:"istioVersion,omitempty"`
	// Caller is who opened the stream on the secure port (its SPIFFE ID; none on plaintext).
	Caller      string              `json:"caller,omitempty"`
	Delta       bool                `json:"delta"`
	ConnectedAt time.Time           `json:"connectedAt"`
	Types       []server.TypeStatus `json:"types"`
}

func syncz(d Deps) []SyncStatus {
	out := []SyncStatus{}
	for _, c := range d.Server.Connections() {
		p := c.Proxy
		out = append(out, SyncStatus{ProxyID: p.ID, ConnectionID: c.ID, Discovery: d.Instance, Name: p.Name, Namespace: p.Namespace,
			IPs: p.IPAddresses, Localhost: p.Localhost, ClusterID: p.ClusterID, IstioVersion: p.IstioVersion,
			Caller: c.Caller, Delta: c.Delta(), ConnectedAt: c.ConnectedAt, Types: c.SyncStatus()})
	}
	return out
}

type configEntry struct {
	Kind      config.Kind     `json:"kind"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Source    string          `json:"source"`
	Spec      json.RawMessage `json:"spec"`
}

type configzOut struct {
	Configs   []configEntry       `json:"configs"`
	Documents []filedir.DocStatus `json:"documents"`
	Objects   []kube.ObjectStatus `json:"objects,omitempty"`
	MeshError string              `json:"meshConfigError,omitempty"`
	Mesh      json.RawMessage     `json:"meshConfig,omitempty"`
	Extension any                 `json:"extensions,omitempty"`
}

func configz(d Deps) configzOut {
	out := configzOut{Configs: []configEntry{}, Documents: []filedir.DocStatus{}}
	if d.Configs != nil {
		for _, c := range d.Configs.List() {
			spec, _ := protojson.Marshal(c.Spec)
			out.Configs = append(out.Configs, configEntry{Kind: c.Kind, Namespace: c.Namespace, Name: c.Name, Source: c.Source, Spec: compact(spec)})
		}
	}
	if d.Objects != nil {
		out.Objects = d.Objects()
	}
	if d.Documents != nil {
		out.Documents = d.Documents()
		if d.NotInForce != nil {
			markNotInForce(out.Documents, d.NotInForce())
		}
	}
	if d.Mesh != nil {
		if err := d.Mesh.LastError(); err != nil {
			out.MeshError = err.Error()
		}
		m, _ := protojson.Marshal(d.Mesh.Mesh())
		out.Mesh = compact(m)
	}
	if d.Extensions != nil {
		out.Extension = d.Extensions()
	}
	return out
}

// markNotInForce gives each applied document whose config the registry holds only partly or
// not at all the registry's status for it, and the reason as the document's error.
func markNotInForce(docs []filedir.DocStatus, nif map[config.Key]registry.NotInForce) {
	if len(nif) == 0 {
		return
	}
	for i := range docs {
		c := docs[i].InForce()
		if c == nil || docs[i].Status != "applied" {
			continue
		}
		if n, ok := nif[c.Key()]; ok {
			docs[i].Status, docs[i].Error = n.Status(), n.Reason()
		}
	}
}

// compact re-encodes protojson output, whose whitespace is deliberately unstable.
func compact(b []byte) json.RawMessage {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	out, _ := json.Marshal(v)
	return out
}

// registryService is a service with its endpoints; the model's JSON names are the page's.
type registryService struct {
	*model.Service
	Endpoints []*model.Endpoint `json:"endpoints"`
}

func registryz(d Deps) map[string]any {
	svcs := []registryService{}
	for _, s := range d.Registry.Services() {
		svcs = append(svcs, registryService{Service: s, Endpoints: d.Registry.Endpoints(s.Hostname)})
	}
	out := map[string]any{"services": svcs}
	if d.Workloads != nil {
		out["workloads"] = d.Workloads()
	}
	return out
}

// endpointz is what proxies are sent: the services and endpoints of the latest snapshot
// (istiod's /debug/endpointz), where /debug/registryz is the registry, which a change reaches
// one debounce earlier.
func endpointz(d Deps) map[string]any {
	svcs := []registryService{}
	snap := d.Pusher.Snapshot()
	version := ""
	if snap != nil {
		version = snap.Version
		for _, s := range snap.Services {
			svcs = append(svcs, registryService{Service: s, Endpoints: snap.Endpoints(s.Hostname)})
		}
	}
	return map[string]any{"version": version, "services": svcs}
}

// PushStatus is the latest push and the server's connections, for /debug/push_status.
type PushStatus struct {
	pusher.Status
	Connections int `json:"connections"`
	Queued      int `json:"queued"`
}

func pushStatus(d Deps) PushStatus {
	return PushStatus{Status: d.Pusher.Status(), Connections: len(d.Server.Connections()), Queued: d.Server.Queued()}
}

func configDump(d Deps, w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("proxyID")
	if id == "" {
		http.Error(w, "proxyID is required", http.StatusBadRequest)
		return
	}
	c := d.Server.Connection(id)
	if c == nil {
		http.Error(w, "proxy "+id+" is not connected", http.StatusNotFound)
		return
	}
	view := d.Pusher.View(c.Proxy)
	dump := xds.Dump(view)
	out := map[string]any{"proxy": id, "version": view.Snapshot.Version}
	for _, typ := range []string{xds.ClusterType, xds.EndpointType, xds.ListenerType, xds.RouteType, xds.ExtensionType} {
		list := []json.RawMessage{}
		for _, res := range dump[typ].Items {
			b, err := protojson.Marshal(res.Message)
			if err == nil {
				list = append(list, compact(b))
			}
		}
		out[xds.ShortType(typ)] = list
	}
	out["sync"] = c.SyncStatus()
	out["mtls"] = xds.InboundMTLS(view) // each inbound port's PeerAuthentication mode
	writeJSON(w, out)
}
