// Package status is the agent's status server (port 15020): pod readiness from the
// proxy's admin, the application's probes, one merged Prometheus scrape, and
// /quitquitquit and /debug/ as pilot-agent serves them.
package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/probe"
	"github.com/wasmesh/wasmesh/agent/statsmerge"
)

// AppMetrics is where the application's metrics are scraped (prometheus.io/* annotations).
type AppMetrics struct {
	Host string
	Port int
	Path string
}

// Config is what the server needs.
type Config struct {
	Admin *admin.Client
	// ApplicationPorts must each appear among the proxy's listeners before the pod is
	// ready (pilot-agent's --applicationPorts).
	ApplicationPorts []int
	Probes           *probe.Handler
	AppMetrics       *AppMetrics
	Gatherer         prometheus.Gatherer
	// Draining reports whether termination has started; a draining pod is not ready.
	Draining func() bool
	// HotRestarting reports whether a new proxy epoch is initializing while the previous
	// one, live, still serves (supervisor.HotRestarting); the pod stays ready meanwhile.
	HotRestarting func() bool
	// XDSUpstream, when the agent runs the XDS proxy, is nil while the proxy's
	// configuration stream reaches discovery, else why not (xdsproxy.Proxy.Upstream). It
	// explains a pod not ready for want of configuration; it does not by itself make a
	// configured pod unready (Envoy keeps serving its last configuration while discovery
	// is away, as with Istio's agent).
	XDSUpstream func() error
	// Quit asks the agent to stop, as SIGTERM does.
	Quit func()
	Log  *slog.Logger
	// LogLevel, if set, is the agent's log level, changed at run time through
	// /debug/logging.
	LogLevel *slog.LevelVar
}

// Server serves the status endpoints.
type Server struct {
	c      Config
	client *http.Client
	mux    *http.ServeMux
}

// New returns the server.
func New(c Config) *Server {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	c.Log = c.Log.With("scope", "status")
	s := &Server{c: c, mux: http.NewServeMux(), client: &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}}
	// As pilot-agent's status server: pages that only read answer GET (and HEAD) from
	// anyone who reaches the port (kubelet probes, Prometheus); what changes the agent's
	// state or exposes its internals answers only requests from the pod itself.
	s.mux.HandleFunc("/healthz/ready", readOnly(s.ready))
	s.mux.HandleFunc("/stats/prometheus", readOnly(s.metrics))
	s.mux.HandleFunc("/quitquitquit", localOnly(s.quit))
	if c.Probes != nil {
		s.mux.HandleFunc("/app-health/", readOnly(c.Probes.ServeHTTP))
	}
	s.mux.HandleFunc("/debug/pprof/", localOnly(readOnly(pprof.Index)))
	s.mux.HandleFunc("/debug/pprof/cmdline", localOnly(readOnly(pprof.Cmdline)))
	s.mux.HandleFunc("/debug/pprof/profile", localOnly(readOnly(pprof.Profile)))
	s.mux.HandleFunc("/debug/pprof/symbol", localOnly(readOnly(pprof.Symbol)))
	s.mux.HandleFunc("/debug/pprof/trace", localOnly(readOnly(pprof.Trace)))
	s.mux.HandleFunc("/debug/config_dump", localOnly(readOnly(s.configDump)))
	if c.LogLevel != nil {
		s.mux.HandleFunc("/debug/logging", s.logging)
	}
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve serves on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Ready returns nil when the pod may receive traffic, or why not: the agent is not
// draining, the proxy is LIVE, its first configuration from discovery arrived (CDS and
// LDS updated at least once), and each application port has a listener. During a hot
// restart the admin API belongs to the new epoch, which is not live yet; the previous
// epoch serves the traffic meanwhile, so the new epoch's state does not make the pod
// unready (a certificate rotation must not take the pod out of load balancing).
func (s *Server) Ready(ctx context.Context) error {
	if s.c.Draining != nil && s.c.Draining() {
		return errors.New("agent is draining")
	}
	err := s.proxyReady(ctx)
	if err != nil && s.c.HotRestarting != nil && s.c.HotRestarting() {
		return nil
	}
	if err != nil && s.c.XDSUpstream != nil {
		if up := s.c.XDSUpstream(); up != nil {
			err = fmt.Errorf("%w; %w", err, up)
		}
	}
	return err
}

// proxyReady is Ready's check of the proxy.
func (s *Server) proxyReady(ctx context.Context) error {
	state, live, err := s.c.Admin.Ready(ctx)
	if err != nil {
		return fmt.Errorf("proxy admin not reachable: %w", err)
	}
	if !live {
		return fmt.Errorf("proxy is %s", state)
	}
	stats, err := s.c.Admin.Stats(ctx, `^(cluster_manager\.cds|listener_manager\.lds)\.update_(success|rejected)$`)
	if err != nil {
		return fmt.Errorf("proxy stats: %w", err)
	}
	cds := stats["cluster_manager.cds.update_success"] + stats["cluster_manager.cds.update_rejected"]
	lds := stats["listener_manager.lds.update_success"] + stats["listener_manager.lds.update_rejected"]
	if cds == 0 || lds == 0 {
		return fmt.Errorf("config not received from discovery (CDS updates: %d, LDS updates: %d)", cds, lds)
	}
	if len(s.c.ApplicationPorts) > 0 {
		ls, err := s.c.Admin.Listeners(ctx)
		if err != nil {
			return fmt.Errorf("proxy listeners: %w", err)
		}
		have := map[int]bool{}
		for _, l := range ls {
			have[l.Port] = true
		}
		var missing []string
		for _, p := range s.c.ApplicationPorts {
			if !have[p] {
				missing = append(missing, strconv.Itoa(p))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no proxy listener for application ports %s", strings.Join(missing, ","))
		}
	}
	return nil
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.Ready(ctx); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var proxyPage []byte
	if resp, err := s.c.Admin.Stream(ctx, "/stats/prometheus"); err != nil {
		s.c.Log.Warn("proxy metrics", "err", err)
	} else {
		proxyPage, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			s.c.Log.Warn("proxy metrics", "status", resp.StatusCode, "err", err)
			proxyPage = nil
		}
	}
	var sources [][]*dto.MetricFamily
	if app := s.appMetrics(ctx); app != nil {
		sources = append(sources, app)
	}
	if s.c.Gatherer != nil {
		if fams, err := s.c.Gatherer.Gather(); err != nil {
			s.c.Log.Warn("agent metrics", "err", err)
		} else {
			sources = append(sources, fams)
		}
	}
	var buf bytes.Buffer
	buf.Grow(len(proxyPage) + 16*1024)
	res, err := statsmerge.Write(&buf, proxyPage, sources...)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if len(res.DroppedFamilies) > 0 || res.DroppedSeries > 0 {
		s.c.Log.Debug("merged scrape dropped duplicates", "families", res.DroppedFamilies, "series", res.DroppedSeries)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(buf.Bytes())
}

func (s *Server) appMetrics(ctx context.Context) []*dto.MetricFamily {
	a := s.c.AppMetrics
	if a == nil {
		return nil
	}
	url := fmt.Sprintf("http://%s%s", net.JoinHostPort(a.Host, strconv.Itoa(a.Port)), a.Path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil
	}
	// Text format only: the merged page is text exposition.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.client.Do(req)
	if err != nil {
		s.c.Log.Warn("application metrics", "url", url, "err", err)
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.c.Log.Warn("application metrics", "url", url, "status", resp.StatusCode)
		return nil
	}
	fams, err := statsmerge.ParseText(resp.Body)
	if err != nil {
		s.c.Log.Warn("application metrics are not text exposition", "url", url, "err", err)
		return nil
	}
	return fams
}

// readOnly answers GET and HEAD with h, any other method 405.
func readOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+" not allowed: this page only reads (GET)", http.StatusMethodNotAllowed)
			return
		}
		h(w, r)
	}
}

// localOnly answers requests from a loopback peer with h, others 403 (Istio checks the
// peer address the same way).
func localOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !fromLocalhost(r) {
			http.Error(w, "only requests from localhost are allowed", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

func fromLocalhost(r *http.Request) bool {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) quit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	s.c.Log.Info("quit requested on the status port")
	w.WriteHeader(http.StatusOK)
	if s.c.Quit != nil {
		s.c.Quit()
	}
}

// logging shows the agent's log level (GET) or sets it (PUT or POST ?level=debug|info|warn|error),
// from the pod itself only, like /quitquitquit.
func (s *Server) logging(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, HEAD, PUT, POST")
		http.Error(w, r.Method+" not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if !fromLocalhost(r) {
			http.Error(w, "only requests from localhost are allowed", http.StatusForbidden)
			return
		}
		var l slog.Level
		if err := l.UnmarshalText([]byte(r.URL.Query().Get("level"))); err != nil {
			http.Error(w, "level: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.c.LogLevel.Set(l)
		s.c.Log.Info("log level changed", "level", l.String())
	}
	fmt.Fprintf(w, "level: %s\n", s.c.LogLevel.Level())
}

func (s *Server) configDump(w http.ResponseWriter, r *http.Request) {
	code, body, err := s.c.Admin.Do(r.Context(), http.MethodGet, "/config_dump")
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(body)
}
