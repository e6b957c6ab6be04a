package hcm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/drain"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// Status is what a filter callback tells the connection manager.
type Status int

const (
	// Continue runs the next filter.
	Continue Status = iota
	// Stop ends iteration: the filter has set a response (Stream.SendLocalReply or, for the
	// router, the upstream's).
	Stop
)

// Filter is one HTTP filter's instance for one stream. The connection manager calls
// DecodeHeaders in chain order (the request headers, with the body still unread in
// Stream.Request.Body), EncodeHeaders in reverse order on the response headers of the
// filters whose DecodeHeaders ran, Log once the response is complete (Envoy's access log
// phase, where Wasm's proxy_on_log runs) and Destroy last.
type Filter interface {
	DecodeHeaders(s *Stream) Status
	EncodeHeaders(s *Stream) Status
	Log(s *Stream)
	Destroy(s *Stream)
}

// FilterConfig is a configured filter, shared by the streams of every connection of a
// listener; it makes the per-stream instances.
type FilterConfig interface {
	NewFilter(s *Stream) (Filter, error)
}

// Factory builds a FilterConfig from a typed_config. name is the HttpFilter's name.
type Factory func(ctx *Context, name string, cfg *anypb.Any) (FilterConfig, error)

// Registry maps filter type URLs to factories. The server owns one and registers the
// filters it supports (router, wasm, fault, cors, ...); an unknown type is rejected unless
// the filter is optional, as in Envoy.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{factories: map[string]Factory{}} }

// Register adds the factory for a type URL ("type.googleapis.com/...").
func (r *Registry) Register(typeURL string, f Factory) {
	r.mu.Lock()
	r.factories[typeURL] = f
	r.mu.Unlock()
}

// Lookup returns the factory of a type URL.
func (r *Registry) Lookup(typeURL string) (Factory, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.factories[typeURL]
	return f, ok
}

// Build makes a FilterConfig for a named typed config, with Envoy's error for types it
// does not know.
func (r *Registry) Build(ctx *Context, name string, cfg *anypb.Any) (FilterConfig, error) {
	f, ok := r.Lookup(cfg.GetTypeUrl())
	if !ok {
		return nil, fmt.Errorf("didn't find a registered implementation for '%s' with type URL: '%s'", name, strings.TrimPrefix(cfg.GetTypeUrl(), "type.googleapis.com/"))
	}
	fc, err := f(ctx, name, cfg)
	if err != nil {
		return nil, fmt.Errorf("http filter %s: %w", name, err)
	}
	return fc, nil
}

// RouteHandle is the current route configuration of an RDS name (nil until it arrived).
type RouteHandle struct {
	Name string
	cfg  atomic.Pointer[route.Config]
}

// Load returns the current configuration.
func (h *RouteHandle) Load() *route.Config { return h.cfg.Load() }

// Store replaces the configuration.
func (h *RouteHandle) Store(c *route.Config) { h.cfg.Store(c) }

// StaticRoutes wraps an inline route configuration.
func StaticRoutes(c *route.Config) *RouteHandle {
	h := &RouteHandle{Name: c.Name}
	h.Store(c)
	return h
}

// FilterHandle is the current configuration of an extension config discovered through
// ECDS (nil until it arrived and no default is set).
type FilterHandle struct {
	Name string
	cfg  atomic.Pointer[filterBox]
}

type filterBox struct{ fc FilterConfig }

// Load returns the current FilterConfig.
func (h *FilterHandle) Load() FilterConfig {
	if b := h.cfg.Load(); b != nil {
		return b.fc
	}
	return nil
}

// Store replaces it.
func (h *FilterHandle) Store(fc FilterConfig) { h.cfg.Store(&filterBox{fc: fc}) }

// Clear forgets the discovered configuration (an ECDS removal): the filter falls back to
// its default_config, or, without one, answers 500 with NFCF, as in Envoy.
func (h *FilterHandle) Clear() { h.cfg.Store(nil) }

// Providers resolve the dynamic parts of an HCM: route configurations by RDS name and
// filter configurations by ECDS name. The server implements them on top of the xDS client.
type Providers interface {
	Routes(name string) *RouteHandle
	Filter(name string) *FilterHandle
}

// ListenerInfo describes the listener a connection manager serves.
type ListenerInfo struct {
	Name string
	// Direction is the listener's traffic_direction: 0 unspecified, 1 inbound, 2 outbound.
	Direction int
	// StatPrefix is the listener's stats scope ("listener.127.0.0.1_8080").
	StatPrefix string
	// BufferLimit is the listener's per_connection_buffer_limit_bytes: how much body a
	// filter may buffer (and the router keep for retries) per stream.
	BufferLimit int
}

// DefaultBufferLimit is Envoy's default per_connection_buffer_limit_bytes (1 MiB).
const DefaultBufferLimit = 1 << 20

// ErrInterrupted is what a body reader returns after a filter answered the stream from a
// body callback (Stream.Interrupt).
var ErrInterrupted = errors.New("stream answered by a filter while the body was flowing")

// Context is what filter factories and the connection manager are built with.
type Context struct {
	Store     *stats.Store
	Clusters  *upstream.Manager
	Log       *slog.Logger
	Registry  *Registry
	Providers Providers
	Listener  ListenerInfo
	Drain     drain.Any
	// AccessLog is where access logs with a stdout/stderr sink go (nil: os.Stdout).
	AccessLog io.Writer
	// Buffers are the body buffers of the process (nil: allocate).
	Buffers *BufferPool
}

// BodyBufferSize is the size of the buffers response and request bodies move through.
const BodyBufferSize = 16 * 1024

// BufferPool hands out body buffers of BodyBufferSize. Unlike sync.Pool it keeps them
// across garbage collections, which a proxy moving bodies all the time would otherwise
// refill after each.
type BufferPool struct{ free chan *[]byte }

// NewBufferPool keeps up to n free buffers.
func NewBufferPool(n int) *BufferPool { return &BufferPool{free: make(chan *[]byte, n)} }

// Get returns a buffer.
func (p *BufferPool) Get() *[]byte {
	if p != nil {
		select {
		case b := <-p.free:
			return b
		default:
		}
	}
	b := make([]byte, BodyBufferSize)
	return &b
}

// Put returns a buffer no longer in use.
func (p *BufferPool) Put(b *[]byte) {
	if p == nil || b == nil {
		return
	}
	select {
	case p.free <- b:
	default:
	}
}

// Response is the response a stream sends: the upstream's or a local reply.
type Response struct {
	Status int
	Header http.Header
	// Body is streamed to the client after EncodeHeaders; nil for none.
	Body io.ReadCloser
	// Trailer, when set, is read after Body reached EOF.
	Trailer func() http.Header
	// Local marks a reply generated by the proxy.
	Local bool
}

// Stream is one HTTP request/response going through the connection manager.
type Stream struct {
	ctx     context.Context
	Request *http.Request
	Info    *streaminfo.Info
	// Response is set by the router (upstream response) or by SendLocalReply.
	Response *Response
	// HTTP2 reports an HTTP/2 downstream.
	HTTP2    bool
	Listener ListenerInfo
	Log      *slog.Logger
	// FilterState is shared between the filters of the stream.
	FilterState map[string]any
	// Worker is the worker the stream's connection belongs to (a connection counter; Wasm
	// filters run a worker's streams on the same VM instance, as Envoy's workers do).
	Worker int
	// StatPrefix is the connection manager's stats scope ("http.<stat_prefix>."), where
	// HTTP filters keep their statistics.
	StatPrefix string
	// StreamIdleTimeout is the connection manager's stream_idle_timeout (Envoy's default
	// five minutes; 0 disables it); a route's idle_timeout overrides it.
	StreamIdleTimeout time.Duration

	interruptMu sync.Mutex
	interrupt   func()

	routes        *RouteHandle
	route         *route.Route
	routeResolved bool
	cluster       *route.WeightedCluster
}

// Context is the stream's context, cancelled when the downstream goes away.
func (s *Stream) Context() context.Context { return s.ctx }

// Route returns the route of the request (matched once and cached, as Envoy's route
// cache), nil when none matched.
func (s *Stream) Route() *route.Route {
	if !s.routeResolved {
		s.routeResolved = true
		s.cluster = nil
		if cfg := s.RouteConfig(); cfg != nil {
			s.route = cfg.Match(s.Request)
		}
		if s.route != nil {
			if wc, ok := s.route.PickCluster(s.Request); ok {
				s.cluster = wc
			}
			name := ""
			if s.cluster != nil {
				name = s.cluster.Name
			}
			s.Info.SetRoute(s.route.Name, name)
		}
	}
	return s.route
}

// RouteCluster returns the cluster the route chose (nil for non-forwarding routes).
func (s *Stream) RouteCluster() *route.WeightedCluster {
	s.Route()
	return s.cluster
}

// RouteConfig returns the route configuration in use.
func (s *Stream) RouteConfig() *route.Config {
	if s.routes == nil {
		return nil
	}
	return s.routes.Load()
}

// ClearRouteCache makes the next Route() match again (a filter changed the headers).
func (s *Stream) ClearRouteCache() { s.routeResolved = false; s.route = nil }

// SendLocalReply answers the stream from the proxy with Envoy's conventions: the body as
// text/plain, the details recorded for %RESPONSE_CODE_DETAILS%, and the flag set. A gRPC
// request gets a gRPC answer instead, as Envoy's local replies do: HTTP 200 with
// grpc-status mapped from the HTTP status and grpc-message holding the body.
func (s *Stream) SendLocalReply(code int, body string, hdr http.Header, details string, flag streaminfo.Flag) Status {
	return s.SendLocalReplyGRPC(code, body, hdr, details, flag, -1)
}

// SendLocalReplyGRPC is SendLocalReply with an explicit gRPC status for gRPC requests (-1:
// derived from the HTTP status).
func (s *Stream) SendLocalReplyGRPC(code int, body string, hdr http.Header, details string, flag streaminfo.Flag, grpcStatus int) Status {
	h := http.Header{}
	for k, v := range hdr {
		h[k] = v
	}
	if IsGRPC(s.Request) {
		if grpcStatus < 0 {
			grpcStatus = GRPCStatusFromHTTP(code)
		}
		h.Set("content-type", "application/grpc")
		h.Set("grpc-status", strconv.Itoa(grpcStatus))
		if body != "" {
			h.Set("grpc-message", grpcMessage(body))
		}
		s.Response = &Response{Status: http.StatusOK, Header: h, Local: true}
		if flag != 0 {
			s.Info.AddFlag(flag)
		}
		s.Info.SetResponse(http.StatusOK, details)
		return Stop
	}
	if body != "" && h.Get("content-type") == "" {
		h.Set("content-type", "text/plain")
	}
	if body != "" {
		h.Set("content-length", fmt.Sprint(len(body)))
	}
	var rc io.ReadCloser
	if body != "" {
		rc = io.NopCloser(strings.NewReader(body))
	}
	s.Response = &Response{Status: code, Header: h, Body: rc, Local: true}
	if flag != 0 {
		s.Info.AddFlag(flag)
	}
	s.Info.SetResponse(code, details)
	return Stop
}

// BufferLimit is how much body a filter may buffer for this stream.
func (s *Stream) BufferLimit() int {
	if s.Listener.BufferLimit > 0 {
		return s.Listener.BufferLimit
	}
	return DefaultBufferLimit
}

// Interrupt answers the stream locally from a body callback, which runs while the router
// may already be sending the request upstream (Envoy's sendLocalReply from decodeData):
// the reply is kept until the router (or the connection manager) applies it, and the body
// reader that called Interrupt returns ErrInterrupted so the upstream request stops.
func (s *Stream) Interrupt(code int, body string, hdr http.Header, details string, flag streaminfo.Flag, grpcStatus int) {
	s.interruptMu.Lock()
	defer s.interruptMu.Unlock()
	if s.interrupt == nil {
		s.interrupt = func() { s.SendLocalReplyGRPC(code, body, hdr, details, flag, grpcStatus) }
	}
}

// Interrupted reports a pending Interrupt.
func (s *Stream) Interrupted() bool {
	s.interruptMu.Lock()
	defer s.interruptMu.Unlock()
	return s.interrupt != nil
}

// ApplyInterrupt makes a pending Interrupt the stream's response; it reports whether
// there was one.
func (s *Stream) ApplyInterrupt() bool {
	s.interruptMu.Lock()
	f := s.interrupt
	s.interrupt = nil
	s.interruptMu.Unlock()
	if f == nil {
		return false
	}
	if s.Response != nil && s.Response.Body != nil {
		_ = s.Response.Body.Close()
	}
	f()
	return true
}

// IsGRPC reports a gRPC request (content-type application/grpc...).
func IsGRPC(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("content-type"), "application/grpc")
}

// GRPCStatusFromHTTP is Envoy's Grpc::Utility::httpToGrpcStatus.
func GRPCStatusFromHTTP(code int) int {
	switch code {
	case http.StatusBadRequest:
		return 13 // INTERNAL
	case http.StatusUnauthorized:
		return 16 // UNAUTHENTICATED
	case http.StatusForbidden:
		return 7 // PERMISSION_DENIED
	case http.StatusNotFound:
		return 12 // UNIMPLEMENTED
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}

// grpcMessage percent-encodes a grpc-message value (gRPC's spec: bytes outside
// printable ASCII and '%').
func grpcMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
