// Package hcm is Envoy's HTTP connection manager for meshproxy: it serves HTTP/1.1 and
// HTTP/2 (h2c, prior knowledge, as gRPC uses) on the connections a listener hands it,
// resolves the route configuration (inline or RDS), runs the HTTP filter chain (filters
// built through a Registry, configs inline or from ECDS), sends the response, writes the
// access logs and keeps the http.<stat_prefix>.* statistics.
package hcm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// TypeURL is the HTTP connection manager's type URL.
const TypeURL = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"

type chainEntry struct {
	name     string
	static   FilterConfig
	dynamic  *FilterHandle
	optional bool
	disabled bool
}

// defaultStreamIdleTimeout is Envoy's default stream_idle_timeout.
const defaultStreamIdleTimeout = 5 * time.Minute

// Manager is one configured HTTP connection manager (one filter chain of a listener).
type Manager struct {
	ctx      *Context
	proto    *hcmv3.HttpConnectionManager
	routes   *RouteHandle
	chain    []chainEntry
	logs     []*accessLog
	st       hcmStats
	lst      listenerStats
	server   *http.Server
	lis      *connListener
	fresh    freshConns
	serverID string

	idleTimeout time.Duration
	streamIdle  time.Duration
	workers     atomic.Uint64
	genReqID    bool
	useRemote   bool
}

type hcmStats struct {
	rqTotal, rqHTTP1, rqHTTP2, rqCompleted, noRoute, directResponse, redirect *stats.Counter
	cxTotal, cxDestroy, cxHTTP1Total, cxHTTP2Total, cxDrainClose, rqRxReset   *stats.Counter
	rqActive, cxActive, cxHTTP1Active, cxHTTP2Active                          *stats.Gauge
	rqTime                                                                    *stats.Histogram
	rqClass                                                                   [6]*stats.Counter
	scope                                                                     stats.Scope
}

type listenerStats struct {
	scope       stats.Scope
	rqClass     [6]*stats.Counter // downstream_rq_<n>xx by n
	rqCompleted *stats.Counter
}

// New builds a connection manager from its proto. Route names and ECDS names it needs
// are resolved through ctx.Providers.
func New(ctx *Context, p *hcmv3.HttpConnectionManager) (*Manager, error) {
	if err := p.ValidateAll(); err != nil {
		return nil, fmt.Errorf("http connection manager: %w", err)
	}
	m := &Manager{ctx: ctx, proto: p, idleTimeout: time.Hour, useRemote: p.GetUseRemoteAddress().GetValue(),
		genReqID: p.GetGenerateRequestId() == nil || p.GetGenerateRequestId().GetValue()}
	switch rs := p.GetRouteSpecifier().(type) {
	case *hcmv3.HttpConnectionManager_RouteConfig:
		c, err := route.Compile(rs.RouteConfig)
		if err != nil {
			return nil, err
		}
		m.routes = StaticRoutes(c)
	case *hcmv3.HttpConnectionManager_Rds:
		m.routes = ctx.Providers.Routes(rs.Rds.GetRouteConfigName())
	default:
		return nil, fmt.Errorf("http connection manager: route specifier %T is not supported", rs)
	}
	if t := p.GetCommonHttpProtocolOptions().GetIdleTimeout(); t != nil {
		m.idleTimeout = t.AsDuration()
	}
	m.streamIdle = defaultStreamIdleTimeout
	if t := p.GetStreamIdleTimeout(); t != nil {
		m.streamIdle = t.AsDuration()
	}
	m.serverID = p.GetServerName()
	if m.serverID == "" {
		m.serverID = "envoy"
	}
	for i, f := range p.GetHttpFilters() {
		e := chainEntry{name: f.GetName(), optional: f.GetIsOptional(), disabled: f.GetDisabled()}
		switch ct := f.GetConfigType().(type) {
		case *hcmv3.HttpFilter_TypedConfig:
			fc, err := ctx.Registry.Build(ctx, f.GetName(), ct.TypedConfig)
			if err != nil {
				if e.optional && isUnknownType(ctx.Registry, ct.TypedConfig) {
					continue
				}
				return nil, fmt.Errorf("http_filters[%d]: %w", i, err)
			}
			e.static = fc
		case *hcmv3.HttpFilter_ConfigDiscovery:
			for _, u := range ct.ConfigDiscovery.GetTypeUrls() {
				if _, ok := ctx.Registry.Lookup(u); !ok {
					return nil, fmt.Errorf("http_filters[%d] (%s): config_discovery type URL %s is not supported", i, f.GetName(), u)
				}
			}
			e.dynamic = ctx.Providers.Filter(f.GetName())
			if d := ct.ConfigDiscovery.GetDefaultConfig(); d != nil && e.dynamic.Load() == nil {
				fc, err := ctx.Registry.Build(ctx, f.GetName(), d)
				if err != nil {
					return nil, fmt.Errorf("http_filters[%d] (%s): default_config: %w", i, f.GetName(), err)
				}
				e.static = fc
			}
		case nil:
			return nil, fmt.Errorf("http_filters[%d] (%s): no typed_config", i, f.GetName())
		}
		m.chain = append(m.chain, e)
	}
	for i, al := range p.GetAccessLog() {
		l, err := newAccessLog(al, ctx.AccessLog)
		if err != nil {
			return nil, fmt.Errorf("access_log[%d]: %w", i, err)
		}
		m.logs = append(m.logs, l)
	}
	sc := ctx.Store.Scope("http." + p.GetStatPrefix())
	m.st = hcmStats{scope: sc,
		rqTotal: sc.Counter("downstream_rq_total"), rqHTTP1: sc.Counter("downstream_rq_http1_total"),
		rqHTTP2: sc.Counter("downstream_rq_http2_total"), rqCompleted: sc.Counter("downstream_rq_completed"),
		noRoute: sc.Counter("no_route"), directResponse: sc.Counter("rq_direct_response"), redirect: sc.Counter("rq_redirect"),
		cxTotal: sc.Counter("downstream_cx_total"), cxDestroy: sc.Counter("downstream_cx_destroy"),
		cxHTTP1Total: sc.Counter("downstream_cx_http1_total"), cxHTTP2Total: sc.Counter("downstream_cx_http2_total"),
		cxDrainClose: sc.Counter("downstream_cx_drain_close"), rqRxReset: sc.Counter("downstream_rq_rx_reset"),
		rqActive: sc.Gauge("downstream_rq_active"), cxActive: sc.Gauge("downstream_cx_active"),
		cxHTTP1Active: sc.Gauge("downstream_cx_http1_active"), cxHTTP2Active: sc.Gauge("downstream_cx_http2_active"),
		rqTime: sc.Histogram("downstream_rq_time"),
	}
	m.lst = listenerStats{scope: ctx.Store.Scope(ctx.Listener.StatPrefix + ".http." + p.GetStatPrefix())}
	m.lst.rqCompleted = m.lst.scope.Counter("downstream_rq_completed")
	for c := 1; c <= 5; c++ {
		name := "downstream_rq_" + strconv.Itoa(c) + "xx"
		m.st.rqClass[c], m.lst.rqClass[c] = sc.Counter(name), m.lst.scope.Counter(name)
	}
	return m, nil
}

func isUnknownType(r *Registry, a *anypb.Any) bool {
	_, ok := r.Lookup(a.GetTypeUrl())
	return !ok
}

// RouteName is the RDS name the manager uses ("" for inline routes).
func (m *Manager) RouteName() string {
	if rds := m.proto.GetRds(); rds != nil {
		return rds.GetRouteConfigName()
	}
	return ""
}

// ECDSNames lists the extension config names the manager's filters discover.
func (m *Manager) ECDSNames() []string {
	var out []string
	for _, e := range m.chain {
		if e.dynamic != nil {
			out = append(out, e.name)
		}
	}
	return out
}

// Ready reports whether the dynamic parts arrived (Envoy's listener warming: routes from
// RDS and, without a default, filter configs from ECDS).
func (m *Manager) Ready() bool {
	if m.routes.Load() == nil {
		return false
	}
	for _, e := range m.chain {
		if e.dynamic != nil && e.dynamic.Load() == nil && e.static == nil {
			return false
		}
	}
	return true
}

// Proto returns the configuration.
func (m *Manager) Proto() *hcmv3.HttpConnectionManager { return m.proto }

// Start makes the manager ready to take connections; it stops serving when ctx ends.
func (m *Manager) Start(ctx context.Context) {
	m.lis = newConnListener()
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	m.server = &http.Server{
		Handler:     m,
		Protocols:   protos,
		IdleTimeout: m.idleTimeout,
		ErrorLog:    nil,
		BaseContext: func(net.Listener) context.Context { return ctx },
		ConnContext: func(c context.Context, conn net.Conn) context.Context {
			return context.WithValue(c, connKey{}, conn)
		},
		ConnState: m.fresh.connState,
	}
	go func() { _ = m.server.Serve(m.lis) }()
	go func() {
		<-ctx.Done()
		_ = m.server.Close()
	}()
}

// ServeConn takes a downstream connection accepted by the listener.
func (m *Manager) ServeConn(conn net.Conn) {
	m.st.cxTotal.Inc()
	m.st.cxActive.Inc()
	// Envoy hands each accepted connection to one worker, whose Wasm VMs run all of its
	// streams; connections take the workers in turn.
	tc := &trackedConn{Conn: conn, worker: int(m.workers.Add(1) - 1), onClose: func() {
		m.st.cxActive.Dec()
		m.st.cxDestroy.Inc()
	}}
	m.fresh.add(tc)
	if !m.lis.push(tc) {
		m.fresh.done(tc)
		_ = tc.Close()
	}
}

// Shutdown serves the first request of the connections accepted so far (see freshConns),
// then closes idle connections and sends GOAWAY / closes HTTP/1.1 connections after their
// current response, waiting until ctx ends for the rest (the end of a drain).
func (m *Manager) Shutdown(ctx context.Context) error {
	if m.server == nil {
		return nil
	}
	m.fresh.wait(ctx)
	return m.server.Shutdown(ctx)
}

type connKey struct{}

// trackedConn counts a connection's close once.
type trackedConn struct {
	net.Conn
	worker  int
	fresh   atomic.Bool // see freshConns
	once    sync.Once
	onClose func()
}

func (c *trackedConn) Close() error {
	c.once.Do(c.onClose)
	return c.Conn.Close()
}

// connListener is the net.Listener the http.Server reads accepted connections from.
type connListener struct {
	ch     chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{} }

// ServeHTTP runs one stream.
func (m *Manager) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	worker := 0
	if tc, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
		m.fresh.done(tc)
		worker = tc.worker
	}
	h2 := r.ProtoMajor == 2
	info := &streaminfo.Info{StartTime: start, DownstreamPeer: r.RemoteAddr, Listener: m.ctx.Listener.Name,
		Direction: m.ctx.Listener.Direction, Protocol: "HTTP/1.1"}
	if h2 {
		info.Protocol = "HTTP/2"
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		info.DownstreamLocal = a.String()
	}
	m.st.rqTotal.Inc()
	m.st.rqActive.Inc()
	defer m.st.rqActive.Dec()
	if h2 {
		m.st.rqHTTP2.Inc()
	} else {
		m.st.rqHTTP1.Inc()
	}
	m.prepareRequest(r, info)
	s := &Stream{ctx: r.Context(), Request: r, Info: info, HTTP2: h2, Listener: m.ctx.Listener, Worker: worker,
		Log: m.ctx.Log, routes: m.routes, FilterState: map[string]any{}, StreamIdleTimeout: m.streamIdle,
		StatPrefix: "http." + m.proto.GetStatPrefix() + "."}

	filters, _ := m.instantiate(s)
	ran := 0
	for i, f := range filters {
		ran = i + 1
		if f.DecodeHeaders(s) == Stop {
			break
		}
	}
	s.ApplyInterrupt()
	if s.Response == nil {
		// No filter answered: the chain had no router, or a filter config is missing.
		if s.Info.Snapshot().Flags&streaminfo.NoFilterConfigFound != 0 {
			s.SendLocalReply(http.StatusInternalServerError, "", nil, "missing_config", 0)
		} else {
			s.SendLocalReply(http.StatusNotFound, "", nil, "route_not_found", streaminfo.NoRouteFound)
		}
	}
	for i := ran - 1; i >= 0; i-- {
		filters[i].EncodeHeaders(s)
	}
	abort := m.writeResponse(w, r, s)
	info.Finish(time.Now())
	snap := info.Snapshot()
	m.recordStats(snap)
	// Envoy writes access logs (and runs the filters' log phase, Wasm's proxy_on_log) once
	// the stream is complete: the response ends when this handler returns, so the logs
	// run after it rather than holding the response's last bytes back.
	go m.finishStream(s, filters)
	if abort {
		// The response broke off (an upstream reset or timeout mid-body): Envoy resets the
		// downstream stream rather than ending the response as if it were complete.
		panic(http.ErrAbortHandler)
	}
}

// finishStream runs the log phase and destroys the stream's filters.
func (m *Manager) finishStream(s *Stream, filters []Filter) {
	defer func() {
		if v := recover(); v != nil {
			s.Log.Error("http filter panicked in the log phase", "panic", v)
		}
	}()
	for i := len(filters) - 1; i >= 0; i-- {
		filters[i].Log(s)
	}
	for _, l := range m.logs {
		l.log(s)
	}
	for i := len(filters) - 1; i >= 0; i-- {
		filters[i].Destroy(s)
	}
}

func (m *Manager) recordStats(snap streaminfo.Snapshot) {
	m.st.rqCompleted.Inc()
	m.st.rqTime.Record(float64(snap.Duration.Microseconds()) / 1000)
	if snap.Code > 0 {
		if c := snap.Code / 100; c >= 1 && c <= 5 {
			m.st.rqClass[c].Inc()
			m.lst.rqClass[c].Inc()
		}
		m.lst.rqCompleted.Inc()
	}
	if snap.Flags&streaminfo.NoRouteFound != 0 {
		m.st.noRoute.Inc()
	}
	if snap.Flags&streaminfo.DownstreamConnectionTermination != 0 {
		m.st.rqRxReset.Inc()
	}
}

// instantiate makes the stream's filter instances; a filter whose ECDS config has not
// arrived answers 500 with NFCF, as Envoy does.
func (m *Manager) instantiate(s *Stream) ([]Filter, []string) {
	filters := make([]Filter, 0, len(m.chain))
	names := make([]string, 0, len(m.chain))
	for _, e := range m.chain {
		if e.disabled {
			continue
		}
		fc := e.static
		if e.dynamic != nil {
			if d := e.dynamic.Load(); d != nil {
				fc = d
			}
		}
		if fc == nil {
			filters = append(filters, missingConfig{})
			names = append(names, e.name)
			continue
		}
		f, err := fc.NewFilter(s)
		if err != nil {
			s.Log.Warn("filter instantiation failed", "filter", e.name, "err", err)
			filters = append(filters, failedFilter{err: err})
			names = append(names, e.name)
			continue
		}
		filters = append(filters, f)
		names = append(names, e.name)
	}
	return filters, names
}

type missingConfig struct{}

func (missingConfig) DecodeHeaders(s *Stream) Status {
	return s.SendLocalReply(http.StatusInternalServerError, "", nil, "missing_config", streaminfo.NoFilterConfigFound)
}
func (missingConfig) EncodeHeaders(*Stream) Status { return Continue }
func (missingConfig) Log(*Stream)                  {}
func (missingConfig) Destroy(*Stream)              {}

type failedFilter struct{ err error }

func (f failedFilter) DecodeHeaders(s *Stream) Status {
	return s.SendLocalReply(http.StatusInternalServerError, "", nil, "filter_instantiation_failed", 0)
}
func (failedFilter) EncodeHeaders(*Stream) Status { return Continue }
func (failedFilter) Log(*Stream)                  {}
func (failedFilter) Destroy(*Stream)              {}

// prepareRequest applies the connection manager's request header handling: x-request-id,
// x-forwarded-proto, x-forwarded-for with use_remote_address.
func (m *Manager) prepareRequest(r *http.Request, info *streaminfo.Info) {
	if m.genReqID && r.Header.Get("x-request-id") == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		h := hex.EncodeToString(b[:])
		r.Header.Set("x-request-id", h[:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:])
	}
	sc := secureConnOf(r)
	if sc != nil {
		info.DownstreamTLS = sc.DownstreamTLS()
	}
	if r.Header.Get("x-forwarded-proto") == "" {
		if sc != nil {
			r.Header.Set("x-forwarded-proto", "https")
		} else {
			r.Header.Set("x-forwarded-proto", "http")
		}
	}
	m.forwardClientCert(r, sc)
	if m.useRemote && !m.proto.GetSkipXffAppend() {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			if prior := r.Header.Get("x-forwarded-for"); prior != "" {
				r.Header.Set("x-forwarded-for", prior+","+host)
			} else {
				r.Header.Set("x-forwarded-for", host)
			}
		}
	}
	if r.Host == "" {
		r.Host = r.URL.Host
	}
}

// writeResponse sends s.Response: headers (with server and drain handling), body,
// trailers. It reports whether the response broke off and the stream must be reset.
func (m *Manager) writeResponse(w http.ResponseWriter, r *http.Request, s *Stream) (abort bool) {
	resp := s.Response
	if resp.Status == 0 && resp.Local {
		return false // the downstream went away before a response existed (DC): nothing to send
	}
	h := w.Header()
	for k, v := range resp.Header {
		if hopHeader(k) {
			continue
		}
		h[k] = v
	}
	if m.proto.GetServerHeaderTransformation() == hcmv3.HttpConnectionManager_OVERWRITE ||
		(m.proto.GetServerHeaderTransformation() == hcmv3.HttpConnectionManager_APPEND_IF_ABSENT && h.Get("server") == "") {
		h.Set("server", m.serverID)
	}
	if m.ctx.Drain.DrainClose() {
		// Envoy's drain: HTTP/1.1 gets Connection: close, HTTP/2 a GOAWAY (net/http turns
		// this header into a graceful GOAWAY on HTTP/2 connections).
		h.Set("Connection", "close")
		m.st.cxDrainClose.Inc()
	}
	code := resp.Status
	if code == 0 {
		code = http.StatusOK
	}
	s.Info.SetResponse(code, "")
	w.WriteHeader(code)
	var sent uint64
	if resp.Body != nil {
		n, err := copyFlush(w, resp.Body, m.ctx.Buffers)
		sent = uint64(n)
		_ = resp.Body.Close()
		if err != nil {
			var werr *writeError
			if errors.As(err, &werr) {
				s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
			} else if s.Request.Context().Err() == nil {
				if s.Info.Snapshot().Flags&(streaminfo.UpstreamRequestTimeout|streaminfo.StreamIdleTimeout) == 0 {
					s.Info.AddFlag(streaminfo.UpstreamConnectionTermination)
				}
				abort = true
			} else {
				s.Info.AddFlag(streaminfo.DownstreamConnectionTermination)
			}
		}
	}
	if resp.Trailer != nil {
		for k, v := range resp.Trailer() {
			for _, vv := range v {
				h.Add(http.TrailerPrefix+k, vv)
			}
		}
	}
	s.Info.AddBytes(0, sent)
	return abort
}

type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }

// copyFlush streams body to w, flushing after every read so streaming responses (gRPC,
// server-sent events) reach the client as they arrive.
func copyFlush(w http.ResponseWriter, body io.Reader, bufs *BufferPool) (int64, error) {
	rc := http.NewResponseController(w)
	bp := bufs.Get()
	defer bufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return total, &writeError{werr}
			}
			total += int64(n)
			if err == nil {
				_ = rc.Flush()
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

var hopHeaders = [...]string{"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}

// hopHeader reports the hop-by-hop headers a proxy never forwards.
func hopHeader(k string) bool {
	for _, h := range hopHeaders {
		if len(k) == len(h) && strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// HopHeader is hopHeader for the router.
func HopHeader(k string) bool { return hopHeader(k) }
