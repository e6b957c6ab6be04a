// Package probe runs the application's Kubernetes probes on behalf of the kubelet: the
// injector rewrites them to the agent's /app-health/<container>/<kind> and passes the
// originals in ISTIO_KUBE_APP_PROBERS, so probes keep working when the proxy would
// otherwise intercept or (with mutual TLS) refuse the kubelet's plain requests.
package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// EnvName is the environment variable holding the probes.
const EnvName = "ISTIO_KUBE_APP_PROBERS"

// Port is a Kubernetes IntOrString port; the injector resolves names to numbers, so
// only numbers (or numeric strings) are accepted.
type Port int

// UnmarshalJSON accepts 8080 and "8080".
func (p *Port) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("port %s is not a port number", b)
	}
	*p = Port(n)
	return nil
}

// Header is one HTTP header of an httpGet probe.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Prober is one Kubernetes probe action (core/v1 field names).
type Prober struct {
	HTTPGet *struct {
		Path        string   `json:"path,omitempty"`
		Port        Port     `json:"port"`
		Host        string   `json:"host,omitempty"`
		Scheme      string   `json:"scheme,omitempty"`
		HTTPHeaders []Header `json:"httpHeaders,omitempty"`
	} `json:"httpGet,omitempty"`
	TCPSocket *struct {
		Port Port   `json:"port"`
		Host string `json:"host,omitempty"`
	} `json:"tcpSocket,omitempty"`
	GRPC *struct {
		Port    Port    `json:"port"`
		Service *string `json:"service,omitempty"`
	} `json:"grpc,omitempty"`
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
}

var pathPattern = regexp.MustCompile(`^/app-health/[^/]+/(livez|readyz|startupz)$`)

// Parse reads ISTIO_KUBE_APP_PROBERS: a JSON object from /app-health/<container>/<kind>
// to a probe with exactly one action. Errors name the variable and the path.
func Parse(text string) (map[string]Prober, error) {
	out := map[string]Prober{}
	if strings.TrimSpace(text) == "" {
		return out, nil
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvName, err)
	}
	for path, p := range out {
		if !pathPattern.MatchString(path) {
			return nil, fmt.Errorf("%s: %q is not /app-health/<container>/livez|readyz|startupz", EnvName, path)
		}
		n := 0
		for _, set := range []bool{p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("%s: %s needs exactly one of httpGet, tcpSocket, grpc", EnvName, path)
		}
		if p.HTTPGet != nil && p.HTTPGet.Scheme != "" && !strings.EqualFold(p.HTTPGet.Scheme, "HTTP") && !strings.EqualFold(p.HTTPGet.Scheme, "HTTPS") {
			return nil, fmt.Errorf("%s: %s: unknown scheme %q", EnvName, path, p.HTTPGet.Scheme)
		}
	}
	return out, nil
}

// Handler serves /app-health/... by running the matching probe against the application
// on host (the pod's localhost).
type Handler struct {
	Probers map[string]Prober
	Host    string
	client  *http.Client
}

// NewHandler returns a handler for probers; host is where the application listens.
func NewHandler(probers map[string]Prober, host string) *Handler {
	return &Handler{Probers: probers, Host: host, client: &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: insecureTLS()},
		// The kubelet does not follow redirects to other hosts; a probe's 3xx is a pass.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := h.Probers[r.URL.Path]
	if !ok {
		http.Error(w, "no probe for "+r.URL.Path, http.StatusNotFound)
		return
	}
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	code, err := h.check(ctx, p, r.Header)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(code)
}

func (h *Handler) host(override string) string {
	if override != "" {
		return override
	}
	return h.Host
}

// check returns the status code to answer with: the application's own code for HTTP
// probes, 200 or 503 for TCP and gRPC.
func (h *Handler) check(ctx context.Context, p Prober, in http.Header) (int, error) {
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		scheme := "http"
		if strings.EqualFold(g.Scheme, "HTTPS") {
			scheme = "https"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(h.host(g.Host), strconv.Itoa(int(g.Port))), path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return http.StatusInternalServerError, err
		}
		for k, vs := range in {
			// The kubelet's own headers pass through, as a direct probe would send them.
			if strings.EqualFold(k, "Connection") || strings.EqualFold(k, "Host") {
				continue
			}
			req.Header[k] = vs
		}
		for _, hd := range g.HTTPHeaders {
			if strings.EqualFold(hd.Name, "Host") {
				req.Host = hd.Value
				continue
			}
			req.Header.Set(hd.Name, hd.Value)
		}
		resp, err := h.client.Do(req)
		if err != nil {
			return http.StatusServiceUnavailable, fmt.Errorf("http probe %s: %w", url, err)
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	case p.TCPSocket != nil:
		addr := net.JoinHostPort(h.host(p.TCPSocket.Host), strconv.Itoa(int(p.TCPSocket.Port)))
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return http.StatusServiceUnavailable, fmt.Errorf("tcp probe %s: %w", addr, err)
		}
		c.Close()
		return http.StatusOK, nil
	default:
		addr := net.JoinHostPort(h.Host, strconv.Itoa(int(p.GRPC.Port)))
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return http.StatusServiceUnavailable, fmt.Errorf("grpc probe %s: %w", addr, err)
		}
		defer conn.Close()
		svc := ""
		if p.GRPC.Service != nil {
			svc = *p.GRPC.Service
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return http.StatusServiceUnavailable, fmt.Errorf("grpc probe %s: %w", addr, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return http.StatusServiceUnavailable, fmt.Errorf("grpc probe %s: service %q is %s", addr, svc, resp.GetStatus())
		}
		return http.StatusOK, nil
	}
}
