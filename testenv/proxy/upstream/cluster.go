package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"golang.org/x/net/http2"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// httpProtocolOptionsKey is the typed_extension_protocol_options key of
// envoy.extensions.upstreams.http.v3.HttpProtocolOptions.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// Envoy's defaults.
const (
	defaultConnectTimeout = 5 * time.Second
	defaultIdleTimeout    = time.Hour
)

// Protocol is the upstream HTTP protocol a cluster speaks.
type Protocol int

// Upstream protocols.
const (
	ProtocolHTTP1 Protocol = iota
	ProtocolHTTP2
	// ProtocolDownstream uses whatever the downstream request used.
	ProtocolDownstream
)

// ConnectError is an upstream connection failure (Envoy's UF).
type ConnectError struct {
	Host string
	Err  error
}

func (e *ConnectError) Error() string { return fmt.Sprintf("connect to %s: %v", e.Host, e.Err) }
func (e *ConnectError) Unwrap() error { return e.Err }

// ClusterStats are Envoy's cluster.<name>.* statistics the proxy keeps.
type ClusterStats struct {
	UpstreamCxTotal, UpstreamCxConnectFail, UpstreamCxDestroy *stats.Counter
	UpstreamCxHTTP1Total, UpstreamCxHTTP2Total                *stats.Counter
	UpstreamCxActive                                          *stats.Gauge
	UpstreamRqTotal, UpstreamRqCompleted, UpstreamRqTimeout   *stats.Counter
	UpstreamRqPendingOverflow, UpstreamRqRetry                *stats.Counter
	UpstreamRqRetrySuccess, UpstreamRqRetryOverflow           *stats.Counter
	UpstreamRqRetryLimitExceeded, UpstreamRqRetryBackoffExp   *stats.Counter
	UpstreamRqPerTryTimeout, UpstreamRqCancelled              *stats.Counter
	UpstreamRqPendingTotal, UpstreamCxOverflow                *stats.Counter
	RetryOrShadowAbandoned                                    *stats.Counter
	UpstreamRqActive, UpstreamRqPendingActive                 *stats.Gauge
	UpstreamRqTime                                            *stats.Histogram
	MembershipHealthy, MembershipTotal, MembershipDegraded    *stats.Gauge
	MembershipExcluded                                        *stats.Gauge
	UpdateSuccess, UpdateEmpty, LBHealthyPanic                *stats.Counter
	UpstreamCxNoneHealthy                                     *stats.Counter
	scope                                                     stats.Scope
	codes                                                     [500]atomic.Pointer[stats.Counter]
	classes                                                   [6]atomic.Pointer[stats.Counter]
}

func newClusterStats(sc stats.Scope) *ClusterStats {
	return &ClusterStats{
		scope:                        sc,
		UpstreamCxTotal:              sc.Counter("upstream_cx_total"),
		UpstreamCxConnectFail:        sc.Counter("upstream_cx_connect_fail"),
		UpstreamCxDestroy:            sc.Counter("upstream_cx_destroy"),
		UpstreamCxHTTP1Total:         sc.Counter("upstream_cx_http1_total"),
		UpstreamCxHTTP2Total:         sc.Counter("upstream_cx_http2_total"),
		UpstreamCxActive:             sc.Gauge("upstream_cx_active"),
		UpstreamRqTotal:              sc.Counter("upstream_rq_total"),
		UpstreamRqCompleted:          sc.Counter("upstream_rq_completed"),
		UpstreamRqTimeout:            sc.Counter("upstream_rq_timeout"),
		UpstreamRqPendingOverflow:    sc.Counter("upstream_rq_pending_overflow"),
		UpstreamRqRetry:              sc.Counter("upstream_rq_retry"),
		UpstreamRqRetrySuccess:       sc.Counter("upstream_rq_retry_success"),
		UpstreamRqRetryOverflow:      sc.Counter("upstream_rq_retry_overflow"),
		UpstreamRqRetryLimitExceeded: sc.Counter("upstream_rq_retry_limit_exceeded"),
		UpstreamRqRetryBackoffExp:    sc.Counter("upstream_rq_retry_backoff_exponential"),
		UpstreamRqPerTryTimeout:      sc.Counter("upstream_rq_per_try_timeout"),
		UpstreamRqCancelled:          sc.Counter("upstream_rq_cancelled"),
		UpstreamRqPendingTotal:       sc.Counter("upstream_rq_pending_total"),
		UpstreamCxOverflow:           sc.Counter("upstream_cx_overflow"),
		RetryOrShadowAbandoned:       sc.Counter("retry_or_shadow_abandoned"),
		UpstreamRqPendingActive:      sc.Gauge("upstream_rq_pending_active"),
		UpstreamRqActive:             sc.Gauge("upstream_rq_active"),
		UpstreamRqTime:               sc.Histogram("upstream_rq_time"),
		MembershipHealthy:            sc.Gauge("membership_healthy"),
		MembershipTotal:              sc.Gauge("membership_total"),
		MembershipDegraded:           sc.Gauge("membership_degraded"),
		MembershipExcluded:           sc.Gauge("membership_excluded"),
		UpdateSuccess:                sc.Counter("update_success"),
		UpdateEmpty:                  sc.Counter("update_empty"),
		LBHealthyPanic:               sc.Counter("lb_healthy_panic"),
		UpstreamCxNoneHealthy:        sc.Counter("upstream_cx_none_healthy"),
	}
}

// Scope is the cluster's stats scope (cluster.<name>), for policies that add their own.
func (s *ClusterStats) Scope() stats.Scope { return s.scope }

// RecordResponse counts a finished upstream request by its status code, Envoy's way
// (upstream_rq_<code>, upstream_rq_<class>xx, upstream_rq_completed, upstream_rq_time).
func (s *ClusterStats) RecordResponse(code int, d time.Duration) {
	s.UpstreamRqCompleted.Inc()
	if code > 0 {
		s.codeCounter(code).Inc()
		if c := code / 100; c >= 1 && c <= 5 {
			s.classCounter(c).Inc()
		} else {
			s.scope.Counter("upstream_rq_" + strconv.Itoa(c) + "xx").Inc()
		}
	}
	s.UpstreamRqTime.Record(float64(d.Microseconds()) / 1000)
}

// codeCounter is upstream_rq_<code>, looked up once per code (a request must not pay a
// name lookup).
func (s *ClusterStats) codeCounter(code int) *stats.Counter {
	if code < 100 || code > 599 {
		return s.scope.Counter("upstream_rq_" + strconv.Itoa(code))
	}
	p := &s.codes[code-100]
	if c := p.Load(); c != nil {
		return c
	}
	c := s.scope.Counter("upstream_rq_" + strconv.Itoa(code))
	p.Store(c)
	return c
}

func (s *ClusterStats) classCounter(class int) *stats.Counter {
	p := &s.classes[class]
	if c := p.Load(); c != nil {
		return c
	}
	c := s.scope.Counter("upstream_rq_" + strconv.Itoa(class) + "xx")
	p.Store(c)
	return c
}

// RecordRetriedResponse counts the response of an attempt that was retried: Envoy charges
// it to retry.upstream_rq_<code> and retry.upstream_rq_<class>xx only.
func (s *ClusterStats) RecordRetriedResponse(code int, d time.Duration) {
	s.UpstreamRqCompleted.Inc()
	s.scope.Counter("retry.upstream_rq_" + strconv.Itoa(code)).Inc()
	s.scope.Counter("retry.upstream_rq_" + strconv.Itoa(code/100) + "xx").Inc()
	s.UpstreamRqTime.Record(float64(d.Microseconds()) / 1000)
}

// Cluster is one upstream cluster with its hosts, balancer, circuit breakers, outlier
// detection and connection pool.
type Cluster struct {
	Name    string
	Config  *clusterv3.Cluster
	Version string
	// ServiceName is the EDS service name (eds_cluster_config.service_name or the name).
	ServiceName string
	Stats       *ClusterStats
	Protocol    Protocol

	lb       LoadBalancer
	rules    priorityRules
	locality bool // locality weighted picking applies to this balancer
	breakers [2]*Breakers
	outlier  *outlierDetector
	hosts    atomic.Pointer[HostSet]
	gen      atomic.Uint64
	state    atomic.Pointer[lbState]
	ids      atomic.Uint64

	connectTimeout time.Duration
	h1             *h1Pool
	h2             *http2.Transport
	cxMu           sync.Mutex
	conns          map[*countedConn]struct{}
	pipeMu         sync.Mutex
	pipeKeys       map[string]string // pipe path -> HTTP/2 pool key
	h2Hosts        sync.Map          // HTTP/2 pool key -> *Host
	transports     *transports
}

// Hosts returns the current host set (never nil once the cluster is active).
func (c *Cluster) Hosts() *HostSet {
	if hs := c.hosts.Load(); hs != nil {
		return hs
	}
	return &HostSet{}
}

// SetHosts replaces the hosts (keeping the per-address state of hosts that stay) and
// updates the membership gauges.
func (c *Cluster) SetHosts(hs *HostSet) {
	old := c.hosts.Load()
	hs.adopt(old)
	c.hosts.Store(hs)
	c.HealthChanged()
	present := make(map[string]bool, len(hs.All))
	for _, h := range hs.All {
		present[h.Address] = true
	}
	c.h1.setHosts(present)
	if old != nil {
		for _, h := range old.All {
			if !present[h.Address] {
				// A host left: drop pooled HTTP/2 connections too (net/http's pool is not
				// per host, so this closes every idle one; busy ones finish).
				c.h2.CloseIdleConnections()
				break
			}
		}
	}
}

func (c *Cluster) updateMembership() {
	hs := c.Hosts()
	var healthy, degraded, excluded int64
	for _, h := range hs.All {
		if h.Healthy() {
			healthy++
		}
		if h.Health == corev3.HealthStatus_DEGRADED {
			degraded++
		}
		if h.Excluded() {
			excluded++
		}
	}
	c.Stats.MembershipTotal.Set(int64(len(hs.All)))
	c.Stats.MembershipHealthy.Set(healthy)
	c.Stats.MembershipDegraded.Set(degraded)
	c.Stats.MembershipExcluded.Set(excluded)
}

// HealthChanged re-counts membership and recomputes the priority loads after a host's
// health changed (outlier detection, EDS).
func (c *Cluster) HealthChanged() {
	c.gen.Add(1)
	c.updateMembership()
}

func (c *Cluster) lbState() *lbState {
	hs, gen := c.Hosts(), c.gen.Load()
	if st := c.state.Load(); st != nil && st.hs == hs && st.gen == gen {
		return st
	}
	st := buildState(hs, gen, c.rules, func() uint64 { return c.ids.Add(1) })
	c.state.Store(st)
	return st
}

// Choose picks a host for a request by Envoy's order: the priority by the priority loads,
// the locality by effective locality weight (with locality_weighted_lb_config), then the
// host by the cluster's balancer, again (up to ctx.HostSelectionAttempts times) when the
// retry host predicate rejects it. nil means no host (UH).
func (c *Cluster) Choose(ctx *LBContext) *Host {
	cands, panic := c.lbState().pick(c.locality)
	if cands == nil || len(cands.Hosts) == 0 {
		c.Stats.UpstreamCxNoneHealthy.Inc()
		return nil
	}
	if panic {
		c.Stats.LBHealthyPanic.Inc()
	}
	if ctx == nil {
		ctx = &LBContext{}
	}
	ctx.attempt = 0
	h := c.lb.Choose(cands, ctx)
	for ctx.rejects(h) && ctx.attempt < ctx.HostSelectionAttempts {
		ctx.attempt++
		h = c.lb.Choose(cands, ctx)
	}
	return h
}

// Breakers returns the circuit breakers of a routing priority (0 DEFAULT, 1 HIGH).
func (c *Cluster) Breakers(priority int) *Breakers {
	if priority < 0 || priority > 1 {
		priority = 0
	}
	return c.breakers[priority]
}

// ReportStatus tells outlier detection the response status an attempt got from h.
func (c *Cluster) ReportStatus(h *Host, status int) {
	if c.outlier != nil && h != nil {
		c.outlier.putHTTPCode(h, status)
	}
}

// ReportResult tells outlier detection about a locally originated outcome.
func (c *Cluster) ReportResult(h *Host, r Result) {
	if c.outlier != nil && h != nil {
		c.outlier.putResult(h, r)
	}
}

// start runs the cluster's background work (the outlier detection interval) until ctx
// ends.
func (c *Cluster) start(ctx context.Context) {
	if c.outlier != nil {
		go c.outlier.run(ctx)
	}
}

// UsesHTTP2 reports whether requests go upstream over HTTP/2 (h2c), given the downstream
// protocol for clusters that follow it.
func (c *Cluster) UsesHTTP2(downstreamHTTP2 bool) bool {
	return c.Protocol == ProtocolHTTP2 || (c.Protocol == ProtocolDownstream && downstreamHTTP2)
}

// RoundTrip sends req to host h over the cluster's pool. downstreamHTTP2 selects the
// protocol for clusters that follow the downstream.
func (c *Cluster) RoundTrip(req *http.Request, h *Host, downstreamHTTP2 bool) (*http.Response, error) {
	req.URL.Scheme = "http"
	if c.UsesHTTP2(downstreamHTTP2) {
		req.URL.Host = c.h2Key(h)
		return c.h2.RoundTrip(req)
	}
	req.URL.Host = h.Address
	return c.h1.roundTrip(req, h)
}

// Close drops the cluster's idle connections (a removed or replaced cluster).
func (c *Cluster) Close() {
	c.h1.closeIdle()
	c.h2.CloseIdleConnections()
}

type countedConn struct {
	net.Conn
	c    *Cluster
	once sync.Once
}

func (cc *countedConn) Close() error {
	cc.once.Do(func() {
		cc.c.Stats.UpstreamCxActive.Dec()
		cc.c.Stats.UpstreamCxDestroy.Inc()
		cc.c.cxMu.Lock()
		delete(cc.c.conns, cc)
		cc.c.cxMu.Unlock()
	})
	return cc.Conn.Close()
}

// h2Key is the authority the HTTP/2 transport pools a host's connections by: its address,
// or for a pipe a made-up name (a path is no authority); dialH2 finds the host by it.
func (c *Cluster) h2Key(h *Host) string {
	k := h.Address
	if h.Network != "" {
		c.pipeMu.Lock()
		var ok bool
		if k, ok = c.pipeKeys[h.Address]; !ok {
			k = "pipe-" + strconv.Itoa(len(c.pipeKeys)) + ".invalid:0"
			if c.pipeKeys == nil {
				c.pipeKeys = map[string]string{}
			}
			c.pipeKeys[h.Address] = k
		}
		c.pipeMu.Unlock()
	}
	if v, ok := c.h2Hosts.Load(k); !ok || v.(*Host) != h {
		c.h2Hosts.Store(k, h)
	}
	return k
}

func (c *Cluster) dialH2(ctx context.Context, key string) (net.Conn, error) {
	v, ok := c.h2Hosts.Load(key)
	if !ok {
		return nil, &ConnectError{Host: key, Err: errors.New("unknown host")}
	}
	return c.dial(ctx, v.(*Host), true)
}

func (c *Cluster) dial(ctx context.Context, h *Host, h2 bool) (net.Conn, error) {
	d := net.Dialer{Timeout: c.connectTimeout, KeepAlive: 30 * time.Second}
	conn, err := d.DialContext(ctx, h.DialNetwork(), h.Address)
	if err == nil {
		// The connection counts as connected once its TLS handshake, if any, is done,
		// as Envoy raises Connected after the transport socket's handshake.
		hctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
		conn, err = c.handshake(hctx, conn, h)
		cancel()
	}
	if err != nil {
		c.Stats.UpstreamCxConnectFail.Inc()
		return nil, &ConnectError{Host: h.Address, Err: err}
	}
	c.Stats.UpstreamCxTotal.Inc()
	if h2 {
		c.Stats.UpstreamCxHTTP2Total.Inc()
	} else {
		c.Stats.UpstreamCxHTTP1Total.Inc()
	}
	c.Stats.UpstreamCxActive.Inc()
	cc := &countedConn{Conn: conn, c: c}
	c.cxMu.Lock()
	c.conns[cc] = struct{}{}
	c.cxMu.Unlock()
	return cc, nil
}

// ActiveConnections is the number of open upstream connections.
func (c *Cluster) ActiveConnections() int {
	c.cxMu.Lock()
	defer c.cxMu.Unlock()
	return len(c.conns)
}

func newCluster(cfg *clusterv3.Cluster, version string, sc stats.Scope, lb LoadBalancer) (*Cluster, error) {
	c := &Cluster{
		Name: cfg.GetName(), Config: cfg, Version: version, lb: lb,
		Stats: newClusterStats(sc), conns: map[*countedConn]struct{}{},
		connectTimeout: defaultConnectTimeout,
	}
	c.rules = priorityRules{panicThreshold: PanicThreshold}
	if t := cfg.GetCommonLbConfig().GetHealthyPanicThreshold(); t != nil {
		c.rules.panicThreshold = int(t.GetValue())
	}
	c.rules.localityWeighted = cfg.GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil
	c.locality = c.rules.localityWeighted && !hashBased(cfg.GetLbPolicy())
	c.breakers = breakersFor(cfg, sc, c.Stats)
	if od := cfg.GetOutlierDetection(); od != nil {
		d, err := newOutlierDetector(c, od, sc)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", cfg.GetName(), err)
		}
		c.outlier = d
	}
	c.ServiceName = cfg.GetEdsClusterConfig().GetServiceName()
	if c.ServiceName == "" {
		c.ServiceName = c.Name
	}
	if d := cfg.GetConnectTimeout(); d != nil {
		c.connectTimeout = d.AsDuration()
	}
	idle := defaultIdleTimeout
	proto, err := protocolOf(cfg)
	if err != nil {
		return nil, err
	}
	c.Protocol = proto
	if opts := httpOptions(cfg); opts != nil && opts.GetCommonHttpProtocolOptions().GetIdleTimeout() != nil {
		idle = opts.GetCommonHttpProtocolOptions().GetIdleTimeout().AsDuration()
	}
	c.h1 = newH1Pool(c, idle)
	c.h2 = &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, a string, _ *tls.Config) (net.Conn, error) {
			return c.dialH2(ctx, a)
		},
		IdleConnTimeout:    idle,
		DisableCompression: true,
	}
	return c, nil
}

func httpOptions(cfg *clusterv3.Cluster) *httpv3.HttpProtocolOptions {
	a := cfg.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]
	if a == nil {
		return nil
	}
	o := &httpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(o); err != nil {
		return nil
	}
	return o
}

func protocolOf(cfg *clusterv3.Cluster) (Protocol, error) {
	if a := cfg.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]; a != nil {
		o := &httpv3.HttpProtocolOptions{}
		if err := a.UnmarshalTo(o); err != nil {
			return 0, fmt.Errorf("cluster %s: typed_extension_protocol_options[%s]: %w", cfg.GetName(), httpProtocolOptionsKey, err)
		}
		switch p := o.GetUpstreamProtocolOptions().(type) {
		case *httpv3.HttpProtocolOptions_ExplicitHttpConfig_:
			if p.ExplicitHttpConfig.GetHttp2ProtocolOptions() != nil {
				return ProtocolHTTP2, nil
			}
			return ProtocolHTTP1, nil
		case *httpv3.HttpProtocolOptions_UseDownstreamProtocolConfig:
			return ProtocolDownstream, nil
		case *httpv3.HttpProtocolOptions_AutoConfig:
			return ProtocolDownstream, nil
		}
	}
	//nolint:staticcheck // the deprecated fields are still what older control planes send.
	if cfg.GetHttp2ProtocolOptions() != nil {
		return ProtocolHTTP2, nil
	}
	//nolint:staticcheck
	if cfg.GetProtocolSelection() == clusterv3.Cluster_USE_DOWNSTREAM_PROTOCOL {
		return ProtocolDownstream, nil
	}
	return ProtocolHTTP1, nil
}

// hostSetFromAssignment converts a ClusterLoadAssignment into a host set with its
// overprovisioning factor.
func hostSetFromAssignment(cla *endpointv3.ClusterLoadAssignment) (*HostSet, error) {
	hosts, err := hostsFromAssignment(cla)
	if err != nil {
		return nil, err
	}
	hs := NewHostSet(hosts)
	if f := cla.GetPolicy().GetOverprovisioningFactor(); f != nil {
		hs.OverprovisioningFactor = f.GetValue()
	}
	return hs, nil
}

// hostsFromAssignment converts a ClusterLoadAssignment into hosts.
func hostsFromAssignment(cla *endpointv3.ClusterLoadAssignment) ([]*Host, error) {
	var hosts []*Host
	for i, loc := range cla.GetEndpoints() {
		for j, lbe := range loc.GetLbEndpoints() {
			ep := lbe.GetEndpoint()
			network, addr, err := endpointAddress(ep.GetAddress())
			if err != nil {
				return nil, fmt.Errorf("endpoints[%d].lb_endpoints[%d]: %w", i, j, err)
			}
			h := &Host{
				Address:        addr,
				Network:        network,
				Hostname:       ep.GetHostname(),
				Weight:         max(lbe.GetLoadBalancingWeight().GetValue(), 1),
				Priority:       loc.GetPriority(),
				Locality:       loc.GetLocality(),
				LocalityWeight: loc.GetLoadBalancingWeight().GetValue(),
				Metadata:       lbe.GetMetadata(),
				Health:         lbe.GetHealthStatus(),
			}
			h.st = &hostState{}
			hosts = append(hosts, h)
		}
	}
	return hosts, nil
}

// endpointAddress is the network ("" for TCP, "unix") and address of an endpoint: a
// socket address with a port value, or a pipe.
func endpointAddress(a *corev3.Address) (network, addr string, err error) {
	if p := a.GetPipe(); p != nil {
		if p.GetPath() == "" {
			return "", "", errors.New("pipe address with an empty path")
		}
		return "unix", p.GetPath(), nil
	}
	sa := a.GetSocketAddress()
	if sa == nil {
		return "", "", errors.New("only socket and pipe addresses are supported")
	}
	port, ok := sa.GetPortSpecifier().(*corev3.SocketAddress_PortValue)
	if !ok {
		return "", "", errors.New("named ports are not supported")
	}
	return "", net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(port.PortValue))), nil
}

var errNoHosts = errors.New("no hosts")
