// Package echo is the mesh's sample application: an HTTP server that answers with who it
// is (service, version, pod) and what it received, and that can call further services for
// each request, the way bookinfo's product page calls reviews and reviews calls ratings.
// Knobs for tests (status codes, delays, failing one request in N) make the mesh's routing,
// retries and timeouts observable from outside.
package echo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes one instance of the application.
type Config struct {
	// Service, Version and Pod identify the instance in every answer.
	Service, Version, Pod string
	// Calls are the URLs called, in order, for every request to "/" (for example
	// http://reviews.default.svc.cluster.local:9080/). Their answers are embedded in the
	// response; a failed call makes the response a 502. A tcp://host:port call opens a
	// connection, sends one line and reads the echo (a database's round trip); its Status
	// is 200 when the echo came back.
	Calls []string
	// TCP serves the line echo protocol instead of HTTP (see ServeTCP): the application is
	// then a TCP service, such as bookinfo's database.
	TCP bool
	// OutboundAddress, when set, is where calls are sent instead of the URL's host: the
	// sidecar's outbound listeners in a mesh without traffic capture. The URL's host:port
	// stays the Host header, so the sidecar routes by it.
	OutboundAddress string
	// FailEvery makes every Nth request (N > 0) answer 503, an upstream that fails one
	// request in N.
	FailEvery int
	// Delay is added before every answer.
	Delay time.Duration
	// CallTimeout bounds each call (default 10s).
	CallTimeout time.Duration
	// StartupCall, when set, is called once before the application serves; if it fails the
	// application does not start, as an application that needs a dependency at start-up
	// (the case holdApplicationUntilProxyStarts exists for).
	StartupCall string
}

// Answer is the JSON body of every response.
type Answer struct {
	Service  string            `json:"service"`
	Version  string            `json:"version"`
	Pod      string            `json:"pod"`
	Method   string            `json:"method"`
	Host     string            `json:"host"`
	Path     string            `json:"path"`
	Headers  map[string]string `json:"headers"`
	Upstream []CallResult      `json:"upstream,omitempty"`
}

// CallResult is what one call for this request returned.
type CallResult struct {
	URL    string  `json:"url"`
	Status int     `json:"status"`
	Error  string  `json:"error,omitempty"`
	Answer *Answer `json:"answer,omitempty"`
}

// Server is the application's HTTP handler.
type Server struct {
	cfg    Config
	client *http.Client
	count  atomic.Int64
	served atomic.Int64
	failed atomic.Int64
}

// New validates cfg and returns the handler.
func New(cfg Config) (*Server, error) {
	urls := append([]string{}, cfg.Calls...)
	if cfg.StartupCall != "" {
		urls = append(urls, cfg.StartupCall)
	}
	for _, c := range urls {
		u, err := url.Parse(c)
		if err != nil || (u.Scheme != "http" && u.Scheme != "tcp") || u.Host == "" {
			return nil, fmt.Errorf("echo: call %q is not an http:// or tcp:// URL with a host", c)
		}
	}
	if cfg.OutboundAddress != "" && net.ParseIP(cfg.OutboundAddress) == nil {
		return nil, fmt.Errorf("echo: outbound address %q is not an IP address", cfg.OutboundAddress)
	}
	if cfg.FailEvery < 0 {
		return nil, fmt.Errorf("echo: fail-every %d is negative", cfg.FailEvery)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	s := &Server{cfg: cfg}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second, DialContext: s.dial}
	s.client = &http.Client{Transport: tr, Timeout: cfg.CallTimeout}
	return s, nil
}

// dial connects to a call's host, or to the same port on OutboundAddress when set.
func (s *Server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if s.cfg.OutboundAddress != "" {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		addr = net.JoinHostPort(s.cfg.OutboundAddress, port)
	}
	return d.DialContext(ctx, network, addr)
}

// ServeHTTP answers:
//
//	/healthz             200, for probes
//	/metrics             the application's own metrics (Prometheus text)
//	/status/<code>       that status
//	/delay/<duration>    200 after the duration (Go syntax: 250ms, 2s)
//	anything else        200 with an Answer, after calling Config.Calls
//
// A request header x-echo-status: <code> also sets the status.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/healthz":
		w.WriteHeader(http.StatusOK)
		return
	case r.URL.Path == "/metrics":
		s.writeMetrics(w)
		return
	}
	n := s.count.Add(1)
	if s.cfg.Delay > 0 {
		if !sleep(r.Context(), s.cfg.Delay) {
			return
		}
	}
	status := http.StatusOK
	if s.cfg.FailEvery > 0 && n%int64(s.cfg.FailEvery) == 0 {
		status = http.StatusServiceUnavailable
	}
	if v := r.Header.Get("x-echo-status"); v != "" {
		if c, err := strconv.Atoi(v); err == nil && c >= 200 && c <= 599 {
			status = c
		}
	}
	switch rest, ok := strings.CutPrefix(r.URL.Path, "/status/"); {
	case ok:
		c, err := strconv.Atoi(rest)
		if err != nil || c < 200 || c > 599 {
			http.Error(w, "bad status "+rest, http.StatusBadRequest)
			return
		}
		status = c
	case strings.HasPrefix(r.URL.Path, "/delay/"):
		d, err := time.ParseDuration(strings.TrimPrefix(r.URL.Path, "/delay/"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !sleep(r.Context(), d) {
			return
		}
	}
	ans := s.answer(r)
	if status == http.StatusOK && r.URL.Path == "/" {
		for _, c := range s.cfg.Calls {
			res := s.call(r, c)
			if res.Status != http.StatusOK {
				status = http.StatusBadGateway
			}
			ans.Upstream = append(ans.Upstream, res)
		}
	}
	if status >= 500 {
		s.failed.Add(1)
	}
	s.served.Add(1)
	w.Header().Set("content-type", "application/json")
	w.Header().Set("x-echo-service", s.cfg.Service)
	w.Header().Set("x-echo-version", s.cfg.Version)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(ans)
}

func (s *Server) answer(r *http.Request) *Answer {
	h := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		h[strings.ToLower(k)] = strings.Join(v, ",")
	}
	return &Answer{Service: s.cfg.Service, Version: s.cfg.Version, Pod: s.cfg.Pod,
		Method: r.Method, Host: r.Host, Path: r.URL.RequestURI(), Headers: h}
}

// propagated are the headers a mesh application forwards so traces and routing decisions
// follow a request through the call graph (Istio's bookinfo forwards the same).
var propagated = []string{"x-request-id", "x-user", "end-user", "x-b3-traceid", "x-b3-spanid",
	"x-b3-parentspanid", "x-b3-sampled", "traceparent", "tracestate"}

func (s *Server) call(in *http.Request, target string) CallResult {
	if host, ok := strings.CutPrefix(target, "tcp://"); ok {
		return s.callTCP(in, target, strings.TrimSuffix(host, "/"))
	}
	res := CallResult{URL: target}
	req, err := http.NewRequestWithContext(in.Context(), http.MethodGet, target, nil)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	for _, h := range propagated {
		if v := in.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	var a Answer
	if json.Unmarshal(body, &a) == nil && a.Service != "" {
		res.Answer = &a
	} else if resp.StatusCode != http.StatusOK {
		res.Error = strings.TrimSpace(string(body))
	}
	return res
}

// callTCP is one round trip of the line echo protocol with addr: a line out, its echo back.
func (s *Server) callTCP(in *http.Request, target, addr string) CallResult {
	res := CallResult{URL: target}
	ctx, cancel := context.WithTimeout(in.Context(), s.cfg.CallTimeout)
	defer cancel()
	conn, err := s.dial(ctx, "tcp", addr)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	line := "ping " + in.Header.Get("x-request-id")
	if _, err := fmt.Fprintln(conn, line); err != nil {
		res.Error = err.Error()
		return res
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if !strings.HasSuffix(got, ":"+line+"\n") {
		res.Error = fmt.Sprintf("tcp echo: got %q for %q", got, line)
		return res
	}
	res.Status = http.StatusOK
	return res
}

func (s *Server) writeMetrics(w http.ResponseWriter) {
	w.Header().Set("content-type", "text/plain; version=0.0.4")
	labels := fmt.Sprintf(`service=%q,version=%q`, s.cfg.Service, s.cfg.Version)
	fmt.Fprintf(w, "# HELP echo_requests_total Requests answered by the echo application.\n")
	fmt.Fprintf(w, "# TYPE echo_requests_total counter\n")
	fmt.Fprintf(w, "echo_requests_total{%s} %d\n", labels, s.served.Load())
	fmt.Fprintf(w, "# HELP echo_failed_requests_total Requests the echo application answered with a 5xx.\n")
	fmt.Fprintf(w, "# TYPE echo_failed_requests_total counter\n")
	fmt.Fprintf(w, "echo_failed_requests_total{%s} %d\n", labels, s.failed.Load())
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Start makes the start-up call, if any: an error means the application cannot start.
func (s *Server) Start(ctx context.Context) error {
	if s.cfg.StartupCall == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.StartupCall, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("echo: start-up call to %s: %w", s.cfg.StartupCall, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("echo: start-up call to %s: %s", s.cfg.StartupCall, resp.Status)
	}
	return nil
}

// Serve runs the application on ln until ctx ends, then stops accepting and lets the
// requests in flight finish (within grace). With Config.TCP it serves ServeTCP instead.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	if s.cfg.TCP {
		return s.ServeTCP(ctx, ln, grace)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		return e
	}
	return err
}

// ServeTCP runs the line echo protocol on ln until ctx ends: each line a client sends
// comes back as "<service>-<version>:<line>". Connections still open then get grace to end.
func (s *Server) ServeTCP(ctx context.Context, ln net.Listener, grace time.Duration) error {
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				s.served.Add(1)
				if _, err := fmt.Fprintf(c, "%s-%s:%s\n", s.cfg.Service, s.cfg.Version, sc.Text()); err != nil {
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
	}
	return nil
}
