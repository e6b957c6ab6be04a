// Package streaminfo is what the proxy knows about one HTTP stream besides its headers:
// Envoy's StreamInfo (timing, addresses, the routing decision, the upstream host, sizes,
// response code and details, response flags). The connection manager fills it, the router
// and filters add to it, and the access log and Wasm filters read it.
package streaminfo

import (
	"crypto/x509"
	"strings"
	"sync"
	"time"
)

// Flag is one of Envoy's response flags (StreamInfo::ResponseFlag), a bit of the
// response.flags attribute.
type Flag uint64

// Envoy's response flags in bit order.
const (
	FailedLocalHealthCheck Flag = 1 << iota
	NoHealthyUpstream
	UpstreamRequestTimeout
	LocalReset
	UpstreamRemoteReset
	UpstreamConnectionFailure
	UpstreamConnectionTermination
	UpstreamOverflow
	NoRouteFound
	DelayInjected
	FaultInjected
	RateLimited
	UnauthorizedExternalService
	RateLimitServiceError
	DownstreamConnectionTermination
	UpstreamRetryLimitExceeded
	StreamIdleTimeout
	InvalidEnvoyRequestHeaders
	DownstreamProtocolError
	UpstreamMaxStreamDurationReached
	ResponseFromCacheFilter
	NoFilterConfigFound
	DurationTimeout
	UpstreamProtocolError
	NoClusterFound
	OverloadManager
	DNSResolutionFailed
	DropOverLoad
	DownstreamRemoteReset
)

// flagCodes are the short codes of the flags, in bit order.
var flagCodes = [...]string{
	"LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE",
	"DC", "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF",
	"DO", "DR",
}

// FormatFlags renders flags as Envoy's %RESPONSE_FLAGS%: short codes joined by ",", "-"
// for none.
func FormatFlags(f Flag) string {
	if f == 0 {
		return "-"
	}
	var parts []string
	for i, c := range flagCodes {
		if f&(1<<i) != 0 {
			parts = append(parts, c)
		}
	}
	return strings.Join(parts, ",")
}

// Info is one stream's information. The fields written after the stream started are
// guarded by the mutex because the access log and Wasm read them from other goroutines.
type Info struct {
	mu sync.Mutex

	StartTime       time.Time
	Protocol        string // "HTTP/1.1", "HTTP/2"
	DownstreamPeer  string // ip:port of the client
	DownstreamLocal string
	// Listener is the name of the listener; Direction its traffic_direction (0 unspecified,
	// 1 inbound, 2 outbound).
	Listener  string
	Direction int
	// DownstreamTLS is the client connection's TLS (nil when it is plaintext), fixed when
	// the connection's handshake completed, before any stream starts.
	DownstreamTLS *TLS

	routeName       string
	clusterName     string
	upstream        string
	upstreamLocal   string
	flags           Flag
	code            int
	details         string
	bytesIn         uint64
	bytesOut        uint64
	duration        time.Duration
	upstreamFailure string
	attempts        int
	upstreamTLS     *TLS
}

// TLS is what one TLS connection established (Envoy's Ssl::ConnectionInfo): the values the
// RBAC filter, x-forwarded-client-cert, the access log and Wasm's connection.* and
// upstream.* attributes read. It is immutable once made.
type TLS struct {
	Version string // "TLSv1.2", "TLSv1.3"
	Cipher  string // IANA name, e.g. "TLS_AES_128_GCM_SHA256"
	SNI     string // the server name the client asked for
	ALPN    string // the negotiated application protocol
	// PeerURISANs and LocalURISANs are the URI SANs of the peer's and of our own
	// certificate (a mesh workload's SPIFFE identity comes first); PeerCertificate is the
	// peer's leaf (nil when the peer sent none), PeerSubject its subject, DNS SANs apart.
	PeerURISANs     []string
	LocalURISANs    []string
	PeerDNSSANs     []string
	PeerSubject     string
	PeerCertificate *x509.Certificate
}

// PeerPrincipal is the peer's identity as Envoy's RBAC reads it (the first URI SAN, else
// the first DNS SAN, else the subject); "" without a peer certificate.
func (t *TLS) PeerPrincipal() string {
	switch {
	case t == nil || t.PeerCertificate == nil:
		return ""
	case len(t.PeerURISANs) > 0:
		return t.PeerURISANs[0]
	case len(t.PeerDNSSANs) > 0:
		return t.PeerDNSSANs[0]
	}
	return t.PeerSubject
}

// SetUpstreamTLS records the TLS of the upstream connection the stream was sent on.
func (i *Info) SetUpstreamTLS(t *TLS) {
	i.mu.Lock()
	i.upstreamTLS = t
	i.mu.Unlock()
}

// SetRoute records the routing decision.
func (i *Info) SetRoute(route, cluster string) {
	i.mu.Lock()
	i.routeName, i.clusterName = route, cluster
	i.mu.Unlock()
}

// SetUpstream records the chosen upstream host and the local address of the connection.
func (i *Info) SetUpstream(host, local string) {
	i.mu.Lock()
	i.upstream, i.upstreamLocal = host, local
	i.attempts++
	i.mu.Unlock()
}

// AddFlag sets a response flag.
func (i *Info) AddFlag(f Flag) {
	i.mu.Lock()
	i.flags |= f
	i.mu.Unlock()
}

// SetResponse records the response code and its details (Envoy's %RESPONSE_CODE_DETAILS%).
func (i *Info) SetResponse(code int, details string) {
	i.mu.Lock()
	i.code = code
	if details != "" {
		i.details = details
	}
	i.mu.Unlock()
}

// SetUpstreamFailure records why the upstream connection failed.
func (i *Info) SetUpstreamFailure(reason string) {
	i.mu.Lock()
	i.upstreamFailure = reason
	i.mu.Unlock()
}

// AddBytes counts request (in) and response (out) body bytes.
func (i *Info) AddBytes(in, out uint64) {
	i.mu.Lock()
	i.bytesIn += in
	i.bytesOut += out
	i.mu.Unlock()
}

// Finish fixes the duration.
func (i *Info) Finish(now time.Time) {
	i.mu.Lock()
	i.duration = now.Sub(i.StartTime)
	i.mu.Unlock()
}

// Snapshot is a copy of the mutable part of Info.
type Snapshot struct {
	RouteName, ClusterName      string
	UpstreamHost, UpstreamLocal string
	Flags                       Flag
	Code                        int
	Details                     string
	BytesIn, BytesOut           uint64
	Duration                    time.Duration
	UpstreamFailure             string
	Attempts                    int
	UpstreamTLS                 *TLS
}

// Snapshot copies the mutable fields.
func (i *Info) Snapshot() Snapshot {
	i.mu.Lock()
	defer i.mu.Unlock()
	return Snapshot{RouteName: i.routeName, ClusterName: i.clusterName, UpstreamHost: i.upstream,
		UpstreamLocal: i.upstreamLocal, Flags: i.flags, Code: i.code, Details: i.details,
		BytesIn: i.bytesIn, BytesOut: i.bytesOut, Duration: i.duration,
		UpstreamFailure: i.upstreamFailure, Attempts: i.attempts, UpstreamTLS: i.upstreamTLS}
}
