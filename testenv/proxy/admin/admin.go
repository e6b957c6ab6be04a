// Package admin serves Envoy's admin API for meshproxy with Envoy's paths, methods and
// formats: /ready, /server_info, /listeners, /clusters, /config_dump, /stats (text,
// usedonly, filter, format=json), /stats/prometheus, /drain_listeners, /healthcheck/fail
// and /ok, /logging, /quitquitquit.
package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/wasmesh/wasmesh/testenv/proxy/logging"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// Backend is the running proxy as the admin API sees it.
type Backend interface {
	// State is Envoy's server state: LIVE, DRAINING, PRE_INITIALIZING or INITIALIZING.
	State() string
	// ServerInfo is the /server_info document.
	ServerInfo() any
	// Listeners lists name and bound address of every active listener.
	Listeners() []ListenerStatus
	// Clusters describes the active clusters for /clusters.
	Clusters() []ClusterStatus
	// ConfigDump is the /config_dump document (JSON).
	// resource narrows it to one repeated field (?resource=), mask trims it (?mask=).
	ConfigDump(resource, mask string, includeEDS bool) ([]byte, error)
	// Certs is the /certs document (JSON, Envoy's admin.v3.Certificates).
	Certs() ([]byte, error)
	// DrainListeners starts draining (graceful) or closes the listeners now.
	DrainListeners(inboundOnly, graceful bool)
	// SetHealthCheckFailed is /healthcheck/fail (true) and /healthcheck/ok (false).
	SetHealthCheckFailed(bool)
	// Quit stops the process.
	Quit()
}

// ListenerStatus is one /listeners entry.
type ListenerStatus struct {
	Name    string
	Address string
}

// HostStatus is one host of /clusters.
type HostStatus struct {
	Address               string
	Healthy               bool
	EDSHealth             string
	Ejected               bool
	Weight                uint32
	Priority              uint32
	Region, Zone, SubZone string
	CxActive, RqActive    int64
	Hostname              string
}

// ClusterStatus is one /clusters entry.
type ClusterStatus struct {
	Name       string
	AddedByAPI bool
	Hosts      []HostStatus
}

// Server is the admin HTTP server.
type Server struct {
	backend Backend
	store   *stats.Store
	loggers *logging.Loggers
	log     *slog.Logger
	mux     *http.ServeMux
	srv     *http.Server
}

// New builds the admin server.
func New(b Backend, store *stats.Store, loggers *logging.Loggers) *Server {
	s := &Server{backend: b, store: store, loggers: loggers, log: loggers.For("admin"), mux: http.NewServeMux()}
	s.routes()
	s.srv = &http.Server{Handler: s.mux}
	return s
}

// Handler exposes the mux (for tests).
func (s *Server) Handler() http.Handler { return s.mux }

// Serve serves on lis until ctx ends.
func (s *Server) Serve(ctx context.Context, lis net.Listener) {
	go func() {
		<-ctx.Done()
		_ = s.srv.Close()
	}()
	_ = s.srv.Serve(lis)
}

// RecordPosts writes the path and query of every POST to w, one a line, before serving
// it: meshproxy's test hook WASMESH_TEST_ADMIN_POSTS (server/testhooks.go). Call it
// before Serve.
func (s *Server) RecordPosts(w io.Writer) {
	var mu sync.Mutex
	next := s.srv.Handler
	s.srv.Handler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			_, _ = io.WriteString(w, r.URL.RequestURI()+"\n")
			mu.Unlock()
		}
		next.ServeHTTP(rw, r)
	})
}

// Close stops serving (the hot-restart parent hands its admin socket over).
func (s *Server) Close() { _ = s.srv.Close() }

func (s *Server) routes() {
	s.mux.HandleFunc("/", s.help)
	s.mux.HandleFunc("/ready", s.ready)
	s.mux.HandleFunc("/server_info", s.serverInfo)
	s.mux.HandleFunc("/listeners", s.listeners)
	s.mux.HandleFunc("/clusters", s.clusters)
	s.mux.HandleFunc("/config_dump", s.configDump)
	s.mux.HandleFunc("/certs", s.certs)
	s.mux.HandleFunc("/stats", s.stats)
	s.mux.HandleFunc("/stats/prometheus", s.prometheus)
	s.mux.HandleFunc("/drain_listeners", post(s.drainListeners))
	s.mux.HandleFunc("/healthcheck/fail", post(func(w http.ResponseWriter, _ *http.Request) {
		s.backend.SetHealthCheckFailed(true)
		ok(w)
	}))
	s.mux.HandleFunc("/healthcheck/ok", post(func(w http.ResponseWriter, _ *http.Request) {
		s.backend.SetHealthCheckFailed(false)
		ok(w)
	}))
	s.mux.HandleFunc("/logging", s.logging)
	// Go's profiles, meshproxy's counterpart of Envoy's /cpuprofiler and /heapprofiler;
	// block and mutex profiles need --contention-profiling.
	s.mux.HandleFunc("/debug/pprof/", pprof.Index)
	s.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("/quitquitquit", post(func(w http.ResponseWriter, _ *http.Request) {
		ok(w)
		if f, isF := w.(http.Flusher); isF {
			f.Flush()
		}
		go s.backend.Quit()
	}))
}

func ok(w http.ResponseWriter) {
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	_, _ = fmt.Fprint(w, "OK\n")
}

// post enforces Envoy's rule that mutating endpoints need POST.
func post(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("content-type", "text/plain; charset=UTF-8")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = fmt.Fprint(w, "This endpoint requires POST.\n")
			return
		}
		h(w, r)
	}
}

func (s *Server) help(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		w.WriteHeader(http.StatusNotFound)
		_, _ = fmt.Fprintf(w, "invalid path. admin commands are:\n")
		return
	}
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	for _, p := range []string{"/certs", "/clusters", "/config_dump", "/drain_listeners", "/healthcheck/fail", "/healthcheck/ok",
		"/listeners", "/logging", "/quitquitquit", "/ready", "/server_info", "/stats", "/stats/prometheus"} {
		_, _ = fmt.Fprintln(w, "  "+p)
	}
}

func (s *Server) ready(w http.ResponseWriter, _ *http.Request) {
	st := s.backend.State()
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	if st != "LIVE" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = fmt.Fprintln(w, st)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("content-type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	_ = enc.Encode(v)
}

func (s *Server) certs(w http.ResponseWriter, _ *http.Request) {
	b, err := s.backend.Certs()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) serverInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.backend.ServerInfo())
}

func splitAddr(a string) (string, int) {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return a, 0
	}
	var port int
	_, _ = fmt.Sscanf(p, "%d", &port)
	return h, port
}

func socketAddress(a string) map[string]any {
	h, p := splitAddr(a)
	return map[string]any{"socket_address": map[string]any{"address": h, "port_value": p}}
}

func (s *Server) listeners(w http.ResponseWriter, r *http.Request) {
	ls := s.backend.Listeners()
	if r.URL.Query().Get("format") == "json" {
		statuses := []any{}
		for _, l := range ls {
			statuses = append(statuses, map[string]any{"name": l.Name, "local_address": socketAddress(l.Address)})
		}
		writeJSON(w, map[string]any{"listener_statuses": statuses})
		return
	}
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	for _, l := range ls {
		_, _ = fmt.Fprintf(w, "%s::%s\n", l.Name, l.Address)
	}
}

func (s *Server) clusters(w http.ResponseWriter, r *http.Request) {
	cs := s.backend.Clusters()
	if r.URL.Query().Get("format") == "json" {
		out := []any{}
		for _, c := range cs {
			hosts := []any{}
			for _, h := range c.Hosts {
				hs := map[string]any{"eds_health_status": h.EDSHealth}
				if h.Ejected {
					hs["failed_outlier_check"] = true
				}
				hosts = append(hosts, map[string]any{
					"address": socketAddress(h.Address),
					"stats": []any{
						map[string]any{"name": "cx_active", "type": "GAUGE", "value": h.CxActive},
						map[string]any{"name": "rq_active", "type": "GAUGE", "value": h.RqActive},
					},
					"health_status": hs, "weight": h.Weight, "priority": h.Priority, "hostname": h.Hostname,
					"locality": map[string]any{"region": h.Region, "zone": h.Zone, "sub_zone": h.SubZone},
				})
			}
			out = append(out, map[string]any{"name": c.Name, "added_via_api": c.AddedByAPI, "host_statuses": hosts,
				"observability_name": c.Name})
		}
		writeJSON(w, map[string]any{"cluster_statuses": out})
		return
	}
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%s::observability_name::%s\n", c.Name, c.Name)
		fmt.Fprintf(&b, "%s::added_via_api::%t\n", c.Name, c.AddedByAPI)
		for _, h := range c.Hosts {
			p := c.Name + "::" + h.Address + "::"
			fmt.Fprintf(&b, "%scx_active::%d\n", p, h.CxActive)
			fmt.Fprintf(&b, "%srq_active::%d\n", p, h.RqActive)
			flags := "healthy"
			switch {
			case h.Ejected:
				flags = "/failed_outlier_check"
			case !h.Healthy:
				flags = "/failed_eds_health"
			}
			fmt.Fprintf(&b, "%shostname::%s\n", p, h.Hostname)
			fmt.Fprintf(&b, "%shealth_flags::%s\n", p, flags)
			fmt.Fprintf(&b, "%sweight::%d\n", p, h.Weight)
			fmt.Fprintf(&b, "%sregion::%s\n", p, h.Region)
			fmt.Fprintf(&b, "%szone::%s\n", p, h.Zone)
			fmt.Fprintf(&b, "%ssub_zone::%s\n", p, h.SubZone)
			fmt.Fprintf(&b, "%scanary::false\n", p)
			fmt.Fprintf(&b, "%spriority::%d\n", p, h.Priority)
			fmt.Fprintf(&b, "%ssuccess_rate::-1\n", p)
			fmt.Fprintf(&b, "%slocal_origin_success_rate::-1\n", p)
		}
	}
	_, _ = fmt.Fprint(w, b.String())
}

func (s *Server) configDump(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, eds := q["include_eds"]
	b, err := s.backend.ConfigDump(q.Get("resource"), q.Get("mask"), eds)
	if err != nil {
		w.WriteHeader(http.StatusNotFound)
		_, _ = fmt.Fprintln(w, err)
		return
	}
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) query(w http.ResponseWriter, r *http.Request) (stats.Query, bool) {
	q := r.URL.Query()
	_, used := q["usedonly"]
	sq := stats.Query{UsedOnly: used, Type: q.Get("type")}
	if f := q.Get("filter"); f != "" {
		re, err := regexp.Compile(f)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = fmt.Fprintf(w, "Invalid re2 regex: %v\n", err)
			return sq, false
		}
		sq.Filter = re
	}
	return sq, true
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	sq, good := s.query(w, r)
	if !good {
		return
	}
	switch r.URL.Query().Get("format") {
	case "json":
		w.Header().Set("content-type", "application/json")
		_ = s.store.WriteJSON(w, sq)
	case "prometheus":
		s.prometheus(w, r)
	default:
		w.Header().Set("content-type", "text/plain; charset=UTF-8")
		_ = s.store.WriteText(w, sq)
	}
}

func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	sq, good := s.query(w, r)
	if !good {
		return
	}
	w.Header().Set("content-type", "text/plain; charset=UTF-8")
	_ = s.store.WritePrometheus(w, sq)
}

func (s *Server) drainListeners(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, inbound := q["inboundonly"]
	_, graceful := q["graceful"]
	s.backend.DrainListeners(inbound, graceful)
	ok(w)
}

func (s *Server) logging(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if len(q) > 0 {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = fmt.Fprint(w, "This endpoint requires POST.\n")
			return
		}
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var err error
			switch k {
			case "level":
				var lvl = q.Get(k)
				l, perr := logging.ParseLevel(lvl)
				if err = perr; err == nil {
					s.loggers.SetAll(l)
				}
			case "paths":
				err = s.loggers.SetComponents(q.Get(k))
			default:
				l, perr := logging.ParseLevel(q.Get(k))
				if err = perr; err == nil {
					err = s.loggers.Set(k, l)
				}
			}
			if err != nil {
				w.WriteHeader(http.StatusNotFound)
				_, _ = fmt.Fprintf(w, "error: %v\n", err)
				s.writeLevels(w)
				return
			}
		}
	}
	s.writeLevels(w)
}

func (s *Server) writeLevels(w http.ResponseWriter) {
	_, _ = fmt.Fprint(w, "active loggers:\n")
	for _, l := range s.loggers.Levels() {
		_, _ = fmt.Fprintf(w, "  %s: %s\n", l[0], l[1])
	}
}
