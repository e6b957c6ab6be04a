// Package wasmfilter is envoy.filters.http.wasm for meshproxy, on wasm/host: one
// host.Runtime per process, one host.Plugin per distinct plugin configuration (shared by
// every listener that uses it, with --concurrency VM instances), module code from a local
// file, inline bytes or a remote URL checked against its sha256 (fetched once and
// cached), fail_open, the stream properties the mesh's filters read, the filters'
// metrics exported through the proxy's stats store, and the filters' HTTP and unary gRPC
// calls carried to the proxy's clusters.
package wasmfilter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/httpfilter"
)

// TypeURL is the Wasm HTTP filter's type URL.
const TypeURL = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"

// Options configure the manager.
type Options struct {
	Node        host.Node
	Concurrency int
	Store       *stats.Store
	Clusters    *upstream.Manager
	Log         *slog.Logger
}

// Manager owns the runtime, the fetched modules and the plugins.
type Manager struct {
	ctx     context.Context
	opts    Options
	rt      *host.Runtime
	metrics *host.Metrics
	env     host.Environment

	mu      sync.Mutex
	code    map[string][]byte // remote code by sha256
	plugins map[string]*host.Plugin
}

// compilationCacheDir is where compiled modules are kept between processes, so the proxies
// of a local mesh (and every hot-restart epoch) compile a filter once, not once each:
// $WASMESH_WASM_CACHE_DIR, else the user cache directory; "" (no cache) if neither works.
// wazero writes cache entries by rename, so processes can share it.
func compilationCacheDir() string {
	dir := os.Getenv("WASMESH_WASM_CACHE_DIR")
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(base, "wasmesh", "wazero")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	return dir
}

// New starts the process's Wasm runtime.
func New(ctx context.Context, o Options) (*Manager, error) {
	rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: o.Log, CompilationCacheDir: compilationCacheDir()})
	if err != nil {
		return nil, fmt.Errorf("wasm runtime: %w", err)
	}
	m := &Manager{ctx: ctx, opts: o, rt: rt, metrics: host.NewMetrics(), code: map[string][]byte{}, plugins: map[string]*host.Plugin{}}
	m.env = host.Environment{Logger: o.Log, Properties: map[string]any{"node": o.Node.Property()},
		HTTPCalls: host.HTTPCallDispatcherFunc(m.dispatch), GRPCCalls: host.GRPCCallDispatcherFunc(m.dispatchGRPC)}
	o.Store.AddExternal(m.external)
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		defer m.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, p := range m.plugins {
			_ = p.Close(cctx)
		}
		_ = rt.Close(cctx)
	}()
	return m, nil
}

// external renders the guests' metrics for the stats store.
func (m *Manager) external() []stats.ExternalStat {
	snap := m.metrics.Snapshot()
	out := make([]stats.ExternalStat, 0, len(snap))
	for _, s := range snap {
		e := stats.ExternalStat{Name: s.Name, Value: s.Value}
		switch s.Type {
		case host.MetricCounter:
			e.Kind = stats.KindCounter
		case host.MetricGauge:
			e.Kind = stats.KindGauge
		case host.MetricHistogram:
			e.Kind = stats.KindHistogram
			hv := stats.HistogramValue{Count: s.Count, Sum: float64(s.Sum)}
			for i := range stats.DefaultBuckets {
				if i < len(s.Buckets) {
					hv.Cumulative = append(hv.Cumulative, s.Buckets[i])
				} else {
					hv.Cumulative = append(hv.Cumulative, s.Count)
				}
			}
			e.Histogram = hv
		}
		out = append(out, e)
	}
	return append(out, m.callbackStats()...)
}

// callbackStats is what the guests cost the proxy, per plugin name (summed over that
// name's configurations, old ones included, so that both only grow):
// wasm.<plugin>.callbacks, the calls into the guest's callbacks, and
// wasm.<plugin>.callback_time, the time they took in microseconds.
func (m *Manager) callbackStats() []stats.ExternalStat {
	type cost struct {
		calls int64
		time  time.Duration
	}
	by := map[string]cost{}
	m.mu.Lock()
	for _, p := range m.plugins {
		st := p.Stats()
		c := by[p.Name()]
		c.calls += st.Callbacks
		c.time += st.CallbackTime
		by[p.Name()] = c
	}
	m.mu.Unlock()
	out := make([]stats.ExternalStat, 0, 2*len(by))
	for name, c := range by {
		out = append(out,
			stats.ExternalStat{Name: "wasm." + name + ".callbacks", Kind: stats.KindCounter, Value: c.calls, Proxy: true},
			stats.ExternalStat{Name: "wasm." + name + ".callback_time", Kind: stats.KindCounter, Value: c.time.Microseconds(), Proxy: true})
	}
	return out
}

// Factory builds the filter config of an envoy.filters.http.wasm filter. A module that
// cannot be fetched, compiled, started or configured is an error (the resource is NACKed).
func (m *Manager) Factory(hctx *hcm.Context, name string, a *anypb.Any) (hcm.FilterConfig, error) {
	p, failOpen, err := m.pluginOf(name, a, &wasmhttpv3.Wasm{})
	if err != nil {
		return nil, err
	}
	sc := m.opts.Store.Scope("wasm." + p.Name())
	return &Config{plugin: p, failOpen: failOpen, failures: sc.Counter("failed_streams"), bufs: hctx.Buffers}, nil
}

// wasmConfig is the configuration of Envoy's HTTP or network Wasm filter.
type wasmConfig interface {
	proto.Message
	ValidateAll() error
	GetConfig() *wasmv3.PluginConfig
}

// pluginOf decodes a Wasm filter's configuration a into w, validates it and returns its
// plugin and whether it fails open.
func (m *Manager) pluginOf(name string, a *anypb.Any, w wasmConfig) (*host.Plugin, bool, error) {
	if err := a.UnmarshalTo(w); err != nil {
		return nil, false, err
	}
	if err := w.ValidateAll(); err != nil {
		return nil, false, err
	}
	return m.plugin(name, w.GetConfig())
}

// plugin returns the plugin of a Wasm filter's configuration (HTTP or network), shared by
// every filter with the same code and configuration: compiled, started and configured
// once. name is the filter's name, the plugin's when the configuration names none.
func (m *Manager) plugin(name string, pc *wasmv3.PluginConfig) (*host.Plugin, bool, error) {
	vm := pc.GetVmConfig()
	if vm == nil {
		return nil, false, errors.New("config.vm_config is required (vm sharing through capability restrictions is not supported)")
	}
	code, err := m.loadCode(vm.GetCode())
	if err != nil {
		return nil, false, fmt.Errorf("vm_config.code: %w", err)
	}
	cfgBytes, err := bytesOf(pc.GetConfiguration())
	if err != nil {
		return nil, false, fmt.Errorf("config.configuration: %w", err)
	}
	vmCfg, err := bytesOf(vm.GetConfiguration())
	if err != nil {
		return nil, false, fmt.Errorf("vm_config.configuration: %w", err)
	}
	failOpen := pc.GetFailOpen() //nolint:staticcheck // still what Istio sends
	if pc.GetFailurePolicy() == wasmv3.FailurePolicy_FAIL_OPEN {
		failOpen = true
	}
	// As Envoy: a header callback's StopIteration stops what follows too, unless
	// allow_on_headers_stop_iteration lets it stop the headers alone.
	allowStopIteration := pc.GetAllowOnHeadersStopIteration().GetValue()
	pluginName := pc.GetName()
	if pluginName == "" {
		pluginName = name
	}
	sum := sha256.Sum256(code)
	key := strings.Join([]string{hex.EncodeToString(sum[:]), pluginName, pc.GetRootId(), vm.GetVmId(),
		string(cfgBytes), string(vmCfg), fmt.Sprint(failOpen), fmt.Sprint(allowStopIteration)}, "\x00")
	m.mu.Lock()
	p := m.plugins[key]
	m.mu.Unlock()
	if p == nil {
		mod, err := m.rt.Compile(m.ctx, code)
		if err != nil {
			return nil, false, fmt.Errorf("wasm module of %s: %w", pluginName, err)
		}
		p, err = m.rt.NewPlugin(m.ctx, mod, host.PluginConfig{
			Name: pluginName, RootID: pc.GetRootId(), VMID: vm.GetVmId(), VMConfig: vmCfg, Configuration: cfgBytes,
			FailOpen: failOpen, Instances: max(m.opts.Concurrency, 1), Metrics: m.metrics,
			AllowOnHeadersStopIteration: allowStopIteration,
		}, m.env)
		if err != nil {
			return nil, false, fmt.Errorf("wasm plugin %s: %w", pluginName, err)
		}
		m.mu.Lock()
		if existing := m.plugins[key]; existing != nil {
			m.mu.Unlock()
			_ = p.Close(m.ctx)
			p = existing
		} else {
			m.plugins[key] = p
			m.mu.Unlock()
		}
	}
	return p, failOpen, nil
}

// bytesOf reads a plugin or VM configuration: StringValue or BytesValue (Istio sends
// StringValue holding JSON); other types are passed as their serialized bytes.
func bytesOf(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, nil
	}
	sv := &wrapperspb.StringValue{}
	if a.MessageIs(sv) {
		if err := a.UnmarshalTo(sv); err != nil {
			return nil, err
		}
		return []byte(sv.GetValue()), nil
	}
	bv := &wrapperspb.BytesValue{}
	if a.MessageIs(bv) {
		if err := a.UnmarshalTo(bv); err != nil {
			return nil, err
		}
		return bv.GetValue(), nil
	}
	return a.GetValue(), nil
}

func (m *Manager) loadCode(src *corev3.AsyncDataSource) ([]byte, error) {
	switch s := src.GetSpecifier().(type) {
	case *corev3.AsyncDataSource_Local:
		switch l := s.Local.GetSpecifier().(type) {
		case *corev3.DataSource_Filename:
			b, err := os.ReadFile(l.Filename)
			if err != nil {
				return nil, err
			}
			return b, nil
		case *corev3.DataSource_InlineBytes:
			return l.InlineBytes, nil
		case *corev3.DataSource_InlineString:
			return []byte(l.InlineString), nil
		}
		return nil, errors.New("local: no filename, inline_bytes or inline_string")
	case *corev3.AsyncDataSource_Remote:
		return m.fetch(s.Remote)
	}
	return nil, errors.New("neither local nor remote")
}

// fetch downloads remote code once per sha256 and verifies it.
func (m *Manager) fetch(r *corev3.RemoteDataSource) ([]byte, error) {
	want := strings.ToLower(r.GetSha256())
	if want == "" {
		return nil, errors.New("remote: sha256 is required")
	}
	m.mu.Lock()
	if b := m.code[want]; b != nil {
		m.mu.Unlock()
		return b, nil
	}
	m.mu.Unlock()
	timeout := 5 * time.Second
	if t := r.GetHttpUri().GetTimeout(); t != nil && t.AsDuration() > 0 {
		timeout = t.AsDuration()
	}
	ctx, cancel := context.WithTimeout(m.ctx, timeout)
	defer cancel()
	uri := r.GetHttpUri().GetUri()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, fmt.Errorf("remote %s: %w", uri, err)
	}
	var resp *http.Response
	if cl := m.opts.Clusters.Get(r.GetHttpUri().GetCluster()); cl != nil {
		h := cl.Choose(&upstream.LBContext{})
		if h == nil {
			return nil, fmt.Errorf("remote %s: cluster %s has no healthy host", uri, cl.Name)
		}
		resp, err = cl.RoundTrip(req, h, false)
	} else {
		resp, err = http.DefaultClient.Do(req)
	}
	if err != nil {
		return nil, fmt.Errorf("remote %s: %w", uri, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("remote %s: status %d", uri, resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("remote %s: %w", uri, err)
	}
	got := sha256.Sum256(b)
	if hex.EncodeToString(got[:]) != want {
		return nil, fmt.Errorf("remote %s: sha256 mismatch: got %x, want %s", uri, got, want)
	}
	m.mu.Lock()
	m.code[want] = b
	m.mu.Unlock()
	return b, nil
}

// dispatch carries proxy_http_call through the cluster manager.
func (m *Manager) dispatch(ctx context.Context, req *host.HTTPCallRequest, done func(*host.HTTPCallResponse, error)) error {
	cl := m.opts.Clusters.Get(req.Cluster)
	if cl == nil {
		return host.ErrUnknownCluster
	}
	var method, path, authority string
	hdr := http.Header{}
	for _, kv := range req.Headers {
		switch kv[0] {
		case ":method":
			method = kv[1]
		case ":path":
			path = kv[1]
		case ":authority":
			authority = kv[1]
		default:
			if !strings.HasPrefix(kv[0], ":") {
				hdr.Add(kv[0], kv[1])
			}
		}
	}
	hr, err := http.NewRequestWithContext(ctx, method, "http://"+authority+path, strings.NewReader(string(req.Body)))
	if err != nil {
		return err
	}
	hr.Header = hdr
	hr.Host = authority
	go func() {
		h := cl.Choose(&upstream.LBContext{Request: hr})
		if h == nil {
			done(nil, errors.New("no healthy upstream"))
			return
		}
		resp, err := cl.RoundTrip(hr, h, false)
		if err != nil {
			done(nil, err)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			done(nil, err)
			return
		}
		out := &host.HTTPCallResponse{Headers: [][2]string{{":status", fmt.Sprint(resp.StatusCode)}}, Body: body}
		for k, vs := range resp.Header {
			for _, v := range vs {
				out.Headers = append(out.Headers, [2]string{strings.ToLower(k), v})
			}
		}
		done(out, nil)
	}()
	return nil
}

// Config is one configured Wasm filter.
type Config struct {
	plugin   *host.Plugin
	failOpen bool
	failures *stats.Counter
	bufs     *hcm.BufferPool
}

// failureCounter counts the guest's failures (wasm.<plugin>.failed_streams) for the
// stream's httpfilter.Filter.
type failureCounter struct{ *stats.Counter }

func (failureCounter) Callback(httpfilter.Callback) {}

func (c failureCounter) Failure(*host.Failure) { c.Inc() }

// Plugin is the plugin behind the config.
func (c *Config) Plugin() *host.Plugin { return c.plugin }

// NewFilter starts a stream on the plugin.
func (c *Config) NewFilter(s *hcm.Stream) (hcm.Filter, error) {
	f := &filter{cfg: c, signals: make(chan host.Signal, 8)}
	worker := 0
	if n := c.plugin.Instances(); n > 0 {
		worker = s.Worker % n
	}
	st, err := c.plugin.NewHTTPStream(s.Context(), host.StreamOptions{Worker: worker, PinWorker: true, Info: streamInfo(s), OnSignal: func(sig host.Signal) {
		select {
		case f.signals <- sig:
		default:
		}
	}})
	if err != nil {
		c.failures.Inc()
		if c.failOpen {
			return passThrough{}, nil
		}
		return nil, err
	}
	f.stream = st
	f.fm = httpfilter.New(st, httpfilter.Config{BufferLimit: s.BufferLimit(), Observer: failureCounter{c.failures}})
	return f, nil
}

type passThrough struct{}

func (passThrough) DecodeHeaders(*hcm.Stream) hcm.Status { return hcm.Continue }
func (passThrough) EncodeHeaders(*hcm.Stream) hcm.Status { return hcm.Continue }
func (passThrough) Log(*hcm.Stream)                      {}
func (passThrough) Destroy(*hcm.Stream)                  {}

// filter is meshproxy's I/O around one stream's httpfilter.Filter, which decides what the
// guest's callbacks and signals mean for the stream.
type filter struct {
	cfg     *Config
	stream  *host.HTTPStream
	signals chan host.Signal
	mu      sync.Mutex // serializes fm
	fm      httpfilter.Filter
	// respT are the response trailers given to the filter (nil: none).
	respT *host.Headers
}

func streamInfo(s *hcm.Stream) host.StreamInfo {
	return host.StreamInfo{
		Protocol:    s.Info.Protocol,
		StartTime:   s.Info.StartTime,
		Source:      host.Address(s.Info.DownstreamPeer),
		Destination: host.Address(s.Info.DownstreamLocal),
		Properties:  map[string]any{"listener_direction": int64(s.Info.Direction)},
		Connection:  connectionInfo(s.Info.DownstreamTLS),
	}
}

// connectionInfo is the connection.* attributes of a downstream connection with TLS t (nil:
// plaintext, where Envoy has none of them and connection.mtls is false).
func connectionInfo(t *streaminfo.TLS) host.ConnectionInfo {
	if t == nil {
		return host.ConnectionInfo{}
	}
	c := host.ConnectionInfo{MTLS: t.PeerCertificate != nil, RequestedServerName: t.SNI}
	c.TLSVersion, c.URISanLocalCertificate, c.URISanPeerCertificate, c.DNSSanPeerCertificate,
		c.SubjectPeerCertificate, c.SHA256PeerCertificateDigest = tlsAttrs(t)
	return c
}

// upstreamInfo adds the upstream.* TLS attributes of the upstream connection's TLS t.
func upstreamInfo(u *host.UpstreamInfo, t *streaminfo.TLS) {
	if t == nil {
		return
	}
	u.TLSVersion, u.URISanLocalCertificate, u.URISanPeerCertificate, u.DNSSanPeerCertificate,
		u.SubjectPeerCertificate, u.SHA256PeerCertificateDigest = tlsAttrs(t)
}

// tlsAttrs are the attributes connection.* and upstream.* share, as Envoy renders them: the
// first URI/DNS SAN, the peer's subject in RFC 2253 form, its certificate's SHA-256 in hex.
func tlsAttrs(t *streaminfo.TLS) (version, localURI, peerURI, peerDNS, peerSubject, peerDigest string) {
	first := func(l []string) string {
		if len(l) == 0 {
			return ""
		}
		return l[0]
	}
	version, localURI, peerURI, peerDNS = t.Version, first(t.LocalURISANs), first(t.PeerURISANs), first(t.PeerDNSSANs)
	if c := t.PeerCertificate; c != nil {
		peerSubject = t.PeerSubject
		sum := sha256.Sum256(c.Raw)
		peerDigest = hex.EncodeToString(sum[:])
	}
	return
}

func (f *filter) updateInfo(s *hcm.Stream) {
	snap := s.Info.Snapshot()
	f.stream.UpdateInfo(func(i *host.StreamInfo) {
		i.ClusterName, i.RouteName = snap.ClusterName, snap.RouteName
		i.ResponseCode, i.ResponseCodeDetails = snap.Code, snap.Details
		i.ResponseFlags = uint64(snap.Flags)
		i.Duration = snap.Duration
		i.Upstream.Address = host.Address(snap.UpstreamHost)
		i.Upstream.LocalAddress = host.Address(snap.UpstreamLocal)
		i.Upstream.TransportFailureReason = snap.UpstreamFailure
		upstreamInfo(&i.Upstream, snap.UpstreamTLS)
	})
}

func requestHeaders(r *http.Request) *host.Headers {
	h := host.NewHeaders([2]string{":authority", r.Host}, [2]string{":path", r.URL.RequestURI()},
		[2]string{":method", r.Method}, [2]string{":scheme", "http"})
	addSorted(h, r.Header, false)
	return h
}

func applyRequestHeaders(r *http.Request, h *host.Headers) {
	hdr := http.Header{}
	for _, kv := range h.Pairs() {
		switch kv[0] {
		case ":authority":
			r.Host = kv[1]
		case ":path":
			if u, err := r.URL.Parse(kv[1]); err == nil {
				r.URL.Path, r.URL.RawPath, r.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
			}
		case ":method":
			r.Method = kv[1]
		case ":scheme":
		default:
			hdr.Add(kv[0], kv[1])
		}
	}
	r.Header = hdr
}

func (f *filter) DecodeHeaders(s *hcm.Stream) hcm.Status {
	ctx := s.Context()
	h := requestHeaders(s.Request)
	hasBody := s.Request.Body != nil && s.Request.Body != http.NoBody
	v, out := f.step(host.StreamRequest, func() httpfilter.Verdict {
		return f.fm.Headers(ctx, host.StreamRequest, h, !hasBody)
	})
	var src *chunkSource
	if hasBody {
		src = &chunkSource{r: s.Request.Body, bufs: f.cfg.bufs}
	}
	if v.Kind == httpfilter.Proceed && !out.Headers {
		var err error
		if v, out, err = f.await(ctx, src, host.StreamRequest, out, untilHeaders); err != nil {
			f.abort(s)
			return hcm.Stop
		}
	}
	if v.Kind != httpfilter.Proceed {
		f.answerHeaders(s, v)
		return hcm.Stop
	}
	applyRequestHeaders(s.Request, h)
	s.ClearRouteCache()
	if hasBody {
		s.Request.Body = &bodyFilter{f: f, s: s, src: src, dir: host.StreamRequest, closer: s.Request.Body, pending: out.Data}
	}
	return hcm.Continue
}

func (f *filter) EncodeHeaders(s *hcm.Stream) hcm.Status {
	f.mu.Lock()
	over := f.fm.Over()
	f.mu.Unlock()
	if over || s.Response == nil {
		return hcm.Continue
	}
	ctx := s.Context()
	f.updateInfo(s)
	h := host.NewHeaders([2]string{":status", fmt.Sprint(s.Response.Status)})
	addSorted(h, s.Response.Header, false)
	upstreamBody := s.Response.Body
	v, out := f.step(host.StreamResponse, func() httpfilter.Verdict {
		return f.fm.Headers(ctx, host.StreamResponse, h, upstreamBody == nil)
	})
	var src *chunkSource
	if upstreamBody != nil {
		src = &chunkSource{r: upstreamBody, bufs: f.cfg.bufs}
		f.interceptTrailers(s.Response, src)
	}
	if v.Kind == httpfilter.Proceed && !out.Headers {
		var err error
		v, out, err = f.await(ctx, src, host.StreamResponse, out, untilHeaders)
		if err != nil {
			closeBody(upstreamBody)
			f.abort(s)
			return hcm.Continue
		}
	}
	if v.Kind != httpfilter.Proceed {
		closeBody(upstreamBody)
		f.answerHeaders(s, v)
		return hcm.Continue
	}
	hdr := http.Header{}
	for _, kv := range h.Pairs() {
		if kv[0] == ":status" {
			if code, err := strconv.Atoi(kv[1]); err == nil {
				s.Response.Status = code
			}
			continue
		}
		hdr.Add(kv[0], kv[1])
	}
	s.Response.Header = hdr
	if upstreamBody != nil {
		s.Response.Body = &bodyFilter{f: f, s: s, src: src, dir: host.StreamResponse, closer: upstreamBody, pending: out.Data}
	}
	return hcm.Continue
}

func closeBody(b io.Closer) {
	if b != nil {
		_ = b.Close()
	}
}

// addSorted adds hdr to h in key order (lowercased when lower).
func addSorted(h *host.Headers, hdr http.Header, lower bool) {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := k
		if lower {
			name = strings.ToLower(k)
		}
		for _, v := range hdr[k] {
			h.Add(name, v)
		}
	}
}

// interceptTrailers passes the response trailers through the filter: the body's source
// gives them to it at the body's end, and the response carries what the filter made of
// them.
func (f *filter) interceptTrailers(r *hcm.Response, src *chunkSource) {
	upstream := r.Trailer
	if upstream == nil {
		return
	}
	src.trailers = func() *host.Headers {
		tr := upstream()
		if len(tr) == 0 {
			return nil
		}
		f.respT = host.NewHeaders()
		addSorted(f.respT, tr, true)
		return f.respT
	}
	r.Trailer = func() http.Header {
		if f.respT == nil {
			return upstream()
		}
		out := http.Header{}
		for _, kv := range f.respT.Pairs() {
			out.Add(kv[0], kv[1])
		}
		return out
	}
}

// Log runs proxy_on_log, proxy_on_done and proxy_on_delete with the final stream info.
func (f *filter) Log(s *hcm.Stream) {
	f.updateInfo(s)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fm.Finish(context.WithoutCancel(s.Context()))
}

func (f *filter) Destroy(*hcm.Stream) {}
