// Package meshview serves a page that shows the running mesh, live: the workloads as a
// graph whose edges carry requests per second, error rate, P99 latency and whether the
// calls are mutual TLS (from Prometheus, with the queries Kiali's graph makes over Istio's
// standard metrics), each proxy's sync state per xDS type (from discovery, as
// `meshctl proxy-status` reads it) and the config documents discovery rejected, with file,
// document and field. The page polls /api/mesh every second; `make run` serves it on
// loopback.
package meshview

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/proxystatus"
	"github.com/wasmesh/wasmesh/testenv/promserver"
)

// Sources are what the page reads.
type Sources struct {
	// Prometheus answers the graph's queries.
	Prometheus *promserver.Server
	// Discovery are the discovery replicas' HTTP addresses (host:port).
	Discovery []string
	// Workloads are the workloads running now (nodes drawn even before any traffic).
	Workloads func() []Workload
	// Rejected are the config documents not in force.
	Rejected func(ctx context.Context) ([]Rejected, error)
	// Window is the rate window of the graph's queries (default 30s).
	Window time.Duration
}

// Workload is a node of the graph: Istio's workload name (WORKLOAD_NAME, app-version for
// the local mesh) in a namespace.
type Workload struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Pods      int    `json:"pods"`
}

// Edge is the calls from one workload to another over the window.
type Edge struct {
	From string  `json:"from"`
	To   string  `json:"to"`
	RPS  float64 `json:"rps"`
	// ErrorRate is the share of 5xx answers, 0 to 1.
	ErrorRate float64 `json:"errorRate"`
	// P99Ms is the 99th percentile of the request duration; -1 when not known.
	P99Ms float64 `json:"p99Ms"`
	// MTLS says the server side saw the calls over mutual TLS (connection_security_policy).
	MTLS bool `json:"mtls"`
}

// Proxy is one proxy's sync state.
type Proxy struct {
	Pod       string                  `json:"pod"`
	Discovery string                  `json:"discovery"`
	Types     []proxystatus.TypeState `json:"types"`
}

// Rejected is a config document not wholly in force, as discovery's /debug/configz reports
// it: the file, the document's position, its config, its status and why.
type Rejected struct {
	File     string `json:"file"`
	Document int    `json:"document"`
	Config   string `json:"config"`
	Status   string `json:"status"`
	Error    string `json:"error"`
}

// State is what the page shows at one moment.
type State struct {
	Time      time.Time  `json:"time"`
	Workloads []Workload `json:"workloads"`
	Edges     []Edge     `json:"edges"`
	Proxies   []Proxy    `json:"proxies"`
	Rejected  []Rejected `json:"rejected"`
	// Problems are the sources that could not be read this time.
	Problems []string `json:"problems"`
}

//go:embed page.html
var page []byte

// Handler serves the page at / and its data at /api/mesh.
func Handler(src Sources) http.Handler {
	if src.Window <= 0 {
		src.Window = 30 * time.Second
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /api/mesh", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(src.Read(ctx))
	})
	return mux
}

// Read gathers the state; a source that fails is named in Problems and the rest is shown.
func (src Sources) Read(ctx context.Context) State {
	st := State{Time: time.Now().UTC(), Workloads: []Workload{}, Edges: []Edge{}, Proxies: []Proxy{}, Rejected: []Rejected{}, Problems: []string{}}
	problem := func(what string, err error) { st.Problems = append(st.Problems, what+": "+err.Error()) }
	if src.Workloads != nil {
		st.Workloads = append(st.Workloads, src.Workloads()...)
	}
	if src.Prometheus != nil {
		edges, err := src.edges(ctx)
		if err != nil {
			problem("prometheus", err)
		}
		st.Edges = edges
	}
	st.Workloads = withEdgeEnds(st.Workloads, st.Edges)
	if len(src.Discovery) > 0 {
		proxies, err := proxystatus.Fetch(ctx, http.DefaultClient, src.Discovery)
		if err != nil {
			problem("discovery", err)
		}
		for _, p := range proxies {
			st.Proxies = append(st.Proxies, Proxy{Pod: p.Pod(), Discovery: p.Replica(), Types: p.States()})
		}
		sort.Slice(st.Proxies, func(i, j int) bool { return st.Proxies[i].Pod < st.Proxies[j].Pod })
	}
	if src.Rejected != nil {
		rej, err := src.Rejected(ctx)
		if err != nil {
			problem("config", err)
		}
		st.Rejected = append(st.Rejected, rej...)
	}
	return st
}

// edges runs the graph's queries: requests, 5xx, P99 and mutual TLS by source and
// destination workload, as reported by the server side (which sees every caller, also one
// from outside the mesh: source "unknown").
func (src Sources) edges(ctx context.Context) ([]Edge, error) {
	w := fmt.Sprintf("[%ds]", int(src.Window.Seconds()))
	by := " by (source_workload, destination_workload)"
	queries := []string{
		`sum(rate(istio_requests_total{reporter="destination"}` + w + `))` + by,
		`sum(rate(istio_requests_total{reporter="destination",response_code=~"5.."}` + w + `))` + by,
		`histogram_quantile(0.99, sum(rate(istio_request_duration_milliseconds_bucket{reporter="destination"}` + w + `)) by (source_workload, destination_workload, le))`,
		`sum(rate(istio_requests_total{reporter="destination",connection_security_policy="mutual_tls"}` + w + `))` + by,
	}
	results := make([]map[[2]string]float64, len(queries))
	for i, q := range queries {
		samples, err := src.Prometheus.Query(ctx, q)
		if err != nil {
			return nil, err
		}
		results[i] = map[[2]string]float64{}
		for _, s := range samples {
			results[i][[2]string{s.Labels["source_workload"], s.Labels["destination_workload"]}] = s.Value
		}
	}
	var edges []Edge
	for k, rps := range results[0] {
		if rps <= 0 {
			continue
		}
		e := Edge{From: k[0], To: k[1], RPS: rps, ErrorRate: results[1][k] / rps, P99Ms: -1, MTLS: results[3][k] > 0}
		if p, ok := results[2][k]; ok && !math.IsNaN(p) && !math.IsInf(p, 0) {
			e.P99Ms = p
		}
		edges = append(edges, e)
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].From != edges[j].From {
			return edges[i].From < edges[j].From
		}
		return edges[i].To < edges[j].To
	})
	return edges, nil
}

// withEdgeEnds adds the workloads edges name that are not running pods (a caller from
// outside the mesh, a workload gone), sorted by name.
func withEdgeEnds(ws []Workload, edges []Edge) []Workload {
	known := map[string]bool{}
	for _, w := range ws {
		known[w.Name] = true
	}
	for _, e := range edges {
		for _, n := range []string{e.From, e.To} {
			if !known[n] {
				known[n] = true
				ws = append(ws, Workload{Name: n})
			}
		}
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].Name < ws[j].Name })
	return ws
}
