package server

import (
	"context"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Authorizer admits the streams of an authenticated port (istiod's 15012): who opened a
// stream, then whether the node its first request describes is that caller's (Istio's
// XDS_AUTH and PILOT_ENABLE_XDS_IDENTITY_CHECK). The plaintext port has none.
type Authorizer interface {
	// Authenticate says who opened a stream, from its TLS peer and metadata; its error (a
	// status, Unauthenticated) ends the stream before anything is read.
	Authenticate(ctx context.Context) (Caller, error)
}

// Caller is an authenticated client.
type Caller interface {
	// Authorize checks the node of a stream's first request (a proxy's or a health
	// reporter's); its error (a status, PermissionDenied) ends the stream before the proxy
	// is registered or served.
	Authorize(p *model.Proxy) error
	// String names the caller (its SPIFFE identity), for logs and debug pages.
	String() string
}

// secureADS is ADS on an authenticated port.
type secureADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s    *Server
	auth Authorizer
}

func (a secureADS) StreamAggregatedResources(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	caller, err := a.auth.Authenticate(stream.Context())
	if err != nil {
		return err
	}
	return a.s.streamSotw(stream, caller)
}

func (a secureADS) DeltaAggregatedResources(stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	caller, err := a.auth.Authenticate(stream.Context())
	if err != nil {
		return err
	}
	return a.s.streamDelta(stream, caller)
}

// RegisterSecure serves ADS on g (a TLS server, built with GRPCOptions) with every stream
// authenticated and its node authorized by auth.
func (s *Server) RegisterSecure(g *grpc.Server, auth Authorizer) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, secureADS{s: s, auth: auth})
}

// authorize checks p against the stream's caller (none on the plaintext port).
func authorize(caller Caller, p *model.Proxy) error {
	if caller == nil {
		return nil
	}
	return caller.Authorize(p)
}

func callerName(caller Caller) string {
	if caller == nil {
		return ""
	}
	return caller.String()
}
