package envoytypes

import (
	"fmt"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
)

// Rules Envoy enforces when it loads a resource that protoc-gen-validate cannot express. A
// patched resource that breaks one would be NACKed whole, so they are checked here too.

var (
	routerType = "type.googleapis.com/" + string((&router.Router{}).ProtoReflect().Descriptor().FullName())
	hcmType    = "type.googleapis.com/" + string((&hcm.HttpConnectionManager{}).ProtoReflect().Descriptor().FullName())
	tcpType    = "type.googleapis.com/" + string((&tcpproxy.TcpProxy{}).ProtoReflect().Descriptor().FullName())
)

// terminalNetwork lists network filter types that end a chain.
var terminalNetwork = map[string]bool{
	hcmType: true, tcpType: true,
	"type.googleapis.com/envoy.extensions.filters.network.direct_response.v3.Config": true,
}

func semantic(m proto.Message) error {
	switch v := m.(type) {
	case *hcm.HttpConnectionManager:
		fs := v.GetHttpFilters()
		for i, f := range fs {
			isRouter := f.GetTypedConfig().GetTypeUrl() == routerType
			if isRouter && i != len(fs)-1 {
				return fmt.Errorf("http_filters[%d]: terminal filter %s must be the last HTTP filter", i, f.GetName())
			}
			if !isRouter && i == len(fs)-1 {
				return fmt.Errorf("http_filters[%d]: %s is the last HTTP filter but not a terminal filter (the router must be last)", i, f.GetName())
			}
		}
	case *listener.FilterChain:
		fs := v.GetFilters()
		for i, f := range fs {
			t := f.GetTypedConfig().GetTypeUrl()
			if terminalNetwork[t] && i != len(fs)-1 {
				return fmt.Errorf("filters[%d]: terminal filter %s must be the last network filter", i, f.GetName())
			}
		}
	case *listener.Listener:
		fcs := v.GetFilterChains()
		for i := range fcs {
			for j := 0; j < i; j++ {
				if proto.Equal(fcs[i].GetFilterChainMatch(), fcs[j].GetFilterChainMatch()) {
					return fmt.Errorf("filter_chains[%d] and filter_chains[%d] have the same filter_chain_match", j, i)
				}
			}
		}
	case *route.RouteConfiguration:
		seen := map[string]string{}
		for _, vh := range v.GetVirtualHosts() {
			for _, d := range vh.GetDomains() {
				if other, dup := seen[d]; dup {
					return fmt.Errorf("domain %q is in virtual hosts %s and %s: domains must be unique", d, other, vh.GetName())
				}
				seen[d] = vh.GetName()
			}
		}
	}
	return nil
}
