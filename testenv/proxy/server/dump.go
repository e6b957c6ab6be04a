package server

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/wasmesh/wasmesh/testenv/proxy/admin"
	"github.com/wasmesh/wasmesh/testenv/proxy/bootstrap"
	"github.com/wasmesh/wasmesh/testenv/proxy/xdsclient"
)

// ServerInfo implements admin.Backend with Envoy's /server_info fields.
func (s *Server) ServerInfo() any {
	node, _ := protojson.Marshal(s.boot.GetNode())
	up := strconv.FormatInt(int64(s.Uptime().Seconds()), 10) + "s"
	return map[string]any{
		"version":              "meshproxy/" + bootstrap.UserAgentVersion,
		"state":                s.State(),
		"hot_restart_version":  "meshproxy.1",
		"uptime_current_epoch": up,
		"uptime_all_epochs":    up,
		"node":                 rawJSON(node),
		"command_line_options": map[string]any{
			"base_id":                  strconv.FormatUint(s.opts.BaseID, 10),
			"concurrency":              s.opts.Concurrency,
			"config_path":              s.opts.ConfigPath,
			"restart_epoch":            s.opts.RestartEpoch,
			"drain_time":               durationString(s.opts.DrainTime),
			"parent_shutdown_time":     durationString(s.opts.ParentShutdownTime),
			"drain_strategy":           orDefault(s.opts.DrainStrategy, "Gradual"),
			"service_cluster":          s.boot.GetNode().GetCluster(),
			"service_node":             s.boot.GetNode().GetId(),
			"log_level":                orDefault(s.opts.LogLevel, "info"),
			"component_log_level":      s.opts.ComponentLogLevel,
			"local_address_ip_version": orDefault(s.opts.LocalAddressIPVersion, "v4"),
			"mode":                     "Serve",
		},
	}
}

type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("{}"), nil
	}
	return r, nil
}

func durationString(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// Listeners implements admin.Backend.
func (s *Server) Listeners() []admin.ListenerStatus {
	var out []admin.ListenerStatus
	for _, l := range s.listeners.Active() {
		out = append(out, admin.ListenerStatus{Name: l.Name, Address: l.LocalAddr()})
	}
	return out
}

// Clusters implements admin.Backend.
func (s *Server) Clusters() []admin.ClusterStatus {
	var out []admin.ClusterStatus
	for _, c := range s.clusters.Active() {
		cs := admin.ClusterStatus{Name: c.Name, AddedByAPI: !s.clusters.IsStatic(c.Name)}
		for _, h := range c.Hosts().All {
			cs.Hosts = append(cs.Hosts, admin.HostStatus{
				Address: h.Address, Healthy: h.Healthy(), EDSHealth: h.Health.String(), Ejected: h.Ejected(),
				Weight: h.Weight, Priority: h.Priority, Region: h.Locality.GetRegion(), Zone: h.Locality.GetZone(),
				SubZone: h.Locality.GetSubZone(), RqActive: h.ActiveRequests(), Hostname: h.Hostname,
			})
		}
		out = append(out, cs)
	}
	return out
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("config dump: %v", err)) // only registered message types reach here
	}
	return a
}

// ConfigDump implements admin.Backend with Envoy's admin.v3 dump types, narrowed to one
// repeated field (resource) and trimmed by a field mask as Envoy's /config_dump does.
func (s *Server) ConfigDump(resource, mask string, includeEDS bool) ([]byte, error) {
	now := timestamppb.New(s.started)
	s.mu.Lock()
	versions := map[string]string{}
	for k, v := range s.versions {
		versions[k] = v
	}
	dyn := map[string]map[string]resourceMeta{}
	for t, m := range s.dyn {
		dyn[t] = map[string]resourceMeta{}
		for n, v := range m {
			dyn[t][n] = v
		}
	}
	s.mu.Unlock()

	boot := &adminv3.BootstrapConfigDump{Bootstrap: s.boot, LastUpdated: now}
	clusters := &adminv3.ClustersConfigDump{VersionInfo: versions[xdsclient.CDS]}
	for _, c := range s.clusters.Active() {
		if s.clusters.IsStatic(c.Name) {
			clusters.StaticClusters = append(clusters.StaticClusters, &adminv3.ClustersConfigDump_StaticCluster{Cluster: mustAny(c.Config), LastUpdated: now})
			continue
		}
		clusters.DynamicActiveClusters = append(clusters.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{
			VersionInfo: c.Version, Cluster: mustAny(c.Config), LastUpdated: now})
	}
	for _, c := range s.clusters.Warming() {
		clusters.DynamicWarmingClusters = append(clusters.DynamicWarmingClusters, &adminv3.ClustersConfigDump_DynamicCluster{
			VersionInfo: c.Version, Cluster: mustAny(c.Config), LastUpdated: now})
	}
	listeners := &adminv3.ListenersConfigDump{VersionInfo: versions[xdsclient.LDS]}
	static := map[string]bool{}
	for _, l := range s.boot.GetStaticResources().GetListeners() {
		static[l.GetName()] = true
	}
	dynamic := map[string]*adminv3.ListenersConfigDump_DynamicListener{}
	var order []string
	for _, l := range s.listeners.Active() {
		if static[l.Name] {
			listeners.StaticListeners = append(listeners.StaticListeners, &adminv3.ListenersConfigDump_StaticListener{Listener: mustAny(l.Proto), LastUpdated: now})
			continue
		}
		dynamic[l.Name] = &adminv3.ListenersConfigDump_DynamicListener{Name: l.Name,
			ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: l.Version, Listener: mustAny(l.Proto), LastUpdated: timestamppb.New(l.LastUpdated)}}
		order = append(order, l.Name)
	}
	for _, l := range s.listeners.Warming() {
		d := dynamic[l.Name]
		if d == nil {
			d = &adminv3.ListenersConfigDump_DynamicListener{Name: l.Name}
			dynamic[l.Name] = d
			order = append(order, l.Name)
		}
		d.WarmingState = &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: l.Version, Listener: mustAny(l.Proto), LastUpdated: timestamppb.New(l.LastUpdated)}
	}
	for _, n := range order {
		listeners.DynamicListeners = append(listeners.DynamicListeners, dynamic[n])
	}
	routes := &adminv3.RoutesConfigDump{}
	for _, l := range s.listeners.Active() {
		for _, m := range l.HTTPManagers() {
			if rc := m.Proto().GetRouteConfig(); rc != nil {
				routes.StaticRouteConfigs = append(routes.StaticRouteConfigs, &adminv3.RoutesConfigDump_StaticRouteConfig{RouteConfig: mustAny(rc), LastUpdated: now})
			}
		}
	}
	for _, n := range sortedNames(dyn[xdsclient.RDS]) {
		m := dyn[xdsclient.RDS][n]
		routes.DynamicRouteConfigs = append(routes.DynamicRouteConfigs, &adminv3.RoutesConfigDump_DynamicRouteConfig{
			VersionInfo: m.version, RouteConfig: mustAny(m.proto.(*routev3.RouteConfiguration)), LastUpdated: timestamppb.New(m.at)})
	}
	ecds := &adminv3.EcdsConfigDump{}
	for _, n := range sortedNames(dyn[xdsclient.ECDS]) {
		m := dyn[xdsclient.ECDS][n]
		ecds.EcdsFilters = append(ecds.EcdsFilters, &adminv3.EcdsConfigDump_EcdsFilterConfig{
			VersionInfo: m.version, EcdsFilter: mustAny(m.proto.(*corev3.TypedExtensionConfig)), LastUpdated: timestamppb.New(m.at)})
	}
	dumps := []proto.Message{boot, clusters, ecds, listeners, routes, s.secretsDump()}
	if includeEDS {
		eds := &adminv3.EndpointsConfigDump{}
		for _, n := range sortedNames(dyn[xdsclient.EDS]) {
			m := dyn[xdsclient.EDS][n]
			eds.DynamicEndpointConfigs = append(eds.DynamicEndpointConfigs, &adminv3.EndpointsConfigDump_DynamicEndpointConfig{
				VersionInfo: m.version, EndpointConfig: mustAny(m.proto.(*endpointv3.ClusterLoadAssignment)), LastUpdated: timestamppb.New(m.at)})
		}
		dumps = append(dumps, eds)
	}
	if resource != "" {
		var err error
		if dumps, err = selectResource(dumps, resource); err != nil {
			return nil, err
		}
	}
	configs := make([]*anypb.Any, 0, len(dumps))
	for _, d := range dumps {
		if mask != "" {
			trim(d.ProtoReflect(), strings.Split(mask, ","))
		}
		configs = append(configs, mustAny(d))
	}
	// Envoy prints the proto field names (snake_case).
	return protojson.MarshalOptions{Multiline: true, Indent: " ", UseProtoNames: true}.Marshal(&adminv3.ConfigDump{Configs: configs})
}

// ErrNoResource is a /config_dump?resource= naming no repeated field of the dumps.
var ErrNoResource = errors.New("no such resource")

// selectResource is Envoy's ?resource=: the elements of the repeated message field of that
// name in any of the dumps (dynamic_active_clusters, static_listeners, ...).
func selectResource(dumps []proto.Message, resource string) ([]proto.Message, error) {
	var out []proto.Message
	found := false
	for _, d := range dumps {
		m := d.ProtoReflect()
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(resource))
		if fd == nil || !fd.IsList() || fd.Message() == nil {
			continue
		}
		found = true
		l := m.Get(fd).List()
		for i := 0; i < l.Len(); i++ {
			out = append(out, l.Get(i).Message().Interface())
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: %q is not a repeated field of any config dump", ErrNoResource, resource)
	}
	return out, nil
}

// trim keeps only the fields named by the field mask paths (dotted for nested fields),
// Envoy's FieldMaskUtil::TrimMessage.
func trim(m protoreflect.Message, paths []string) {
	keep := map[string][]string{}
	for _, p := range paths {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		head, rest, _ := strings.Cut(p, ".")
		if rest == "" {
			keep[head] = nil // the whole field
			continue
		}
		if sub, ok := keep[head]; !ok || sub != nil {
			keep[head] = append(sub, rest)
		}
	}
	var clear []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		sub, ok := keep[string(fd.Name())]
		switch {
		case !ok:
			clear = append(clear, fd)
		case sub != nil && fd.Message() != nil && !fd.IsMap():
			if fd.IsList() {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					trim(l.Get(i).Message(), sub)
				}
			} else {
				trim(v.Message(), sub)
			}
		}
		return true
	})
	for _, fd := range clear {
		m.Clear(fd)
	}
}

func sortedNames(m map[string]resourceMeta) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
