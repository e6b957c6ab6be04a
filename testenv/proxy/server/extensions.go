package server

import (
	"github.com/wasmesh/wasmesh/testenv/proxy/cors"
	"github.com/wasmesh/wasmesh/testenv/proxy/fault"
	"github.com/wasmesh/wasmesh/testenv/proxy/rbac"
	"github.com/wasmesh/wasmesh/testenv/proxy/wasmfilter"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// wasmExtension registers envoy.filters.http.wasm and envoy.filters.network.wasm, with one
// Wasm runtime for the process.
func wasmExtension(s *Server) error {
	n := s.boot.GetNode()
	node := host.Node{ID: n.GetId(), Cluster: n.GetCluster(), UserAgentName: n.GetUserAgentName(),
		UserAgentVersion: n.GetUserAgentVersion()}
	if md := n.GetMetadata(); md != nil {
		node.Metadata = md.AsMap()
	}
	node.Locality.Region, node.Locality.Zone, node.Locality.SubZone = n.GetLocality().GetRegion(), n.GetLocality().GetZone(), n.GetLocality().GetSubZone()
	m, err := wasmfilter.New(s.ctx, wasmfilter.Options{Node: node, Concurrency: s.opts.Concurrency, Store: s.store,
		Clusters: s.clusters, Log: s.loggers.For("wasm")})
	if err != nil {
		return err
	}
	s.registry.Register(wasmfilter.TypeURL, m.Factory)
	s.networkFilters[wasmfilter.NetworkTypeURL] = m.NetworkFactory
	return nil
}

// httpFiltersExtension registers the HTTP filters written in Go: envoy.filters.http.fault
// envoy.filters.http.cors and envoy.filters.http.rbac.
func httpFiltersExtension(s *Server) error {
	s.registry.Register(fault.TypeURL, fault.Factory)
	s.registry.Register(cors.TypeURL, cors.Factory)
	s.registry.Register(rbac.HTTPTypeURL, rbac.HTTPFactory)
	return nil
}
