package sds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Envoy's defaults: an SDS source's initial fetch timeout, the stream's reconnect back-off.
const (
	DefaultInitialFetchTimeout = 15 * time.Second
	backoffBase                = 500 * time.Millisecond
	backoffMax                 = 30 * time.Second
)

// Clusters is what the manager needs of the cluster manager: whether a cluster is
// static (Envoy requires an SDS cluster to be) and a connection to one of its hosts.
type Clusters interface {
	IsStatic(name string) bool
	Dial(ctx context.Context, cluster string) (net.Conn, error)
}

// Manager holds the process's secrets.
type Manager struct {
	ctx      context.Context
	log      *slog.Logger
	node     *corev3.Node
	clusters Clusters

	mu      sync.Mutex
	static  map[string]*Provider
	dynamic map[string]*Provider // by source key
	conns   map[string]*grpc.ClientConn
}

// NewManager returns a manager; its SDS streams end with ctx.
func NewManager(ctx context.Context, log *slog.Logger, node *corev3.Node, clusters Clusters) *Manager {
	return &Manager{ctx: ctx, log: log, node: node, clusters: clusters, static: map[string]*Provider{},
		dynamic: map[string]*Provider{}, conns: map[string]*grpc.ClientConn{}}
}

// AddStatic installs a bootstrap static secret.
func (m *Manager) AddStatic(s *tlsv3.Secret) error {
	c, err := Compile(s)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.static[s.GetName()]; dup {
		return fmt.Errorf("secret %s: duplicate static secret name", s.GetName())
	}
	m.static[s.GetName()] = NewStatic(c)
	return nil
}

// Provider returns the provider of an SdsSecretConfig: a static secret (no sds_config),
// or the SDS subscription of that name and source, started on first use and shared.
func (m *Manager) Provider(cfg *tlsv3.SdsSecretConfig) (*Provider, error) {
	name := cfg.GetName()
	src := cfg.GetSdsConfig()
	if src == nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		if p := m.static[name]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("static secret %s is not defined (static_resources.secrets)", name)
	}
	cluster, err := m.sourceCluster(src)
	if err != nil {
		return nil, fmt.Errorf("secret %s: sds_config: %w", name, err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(src)
	if err != nil {
		return nil, err
	}
	key := name + "\x00" + string(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.dynamic[key]; p != nil {
		return p, nil
	}
	conn, err := m.conn(cluster)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	p := &Provider{Name: name, Source: cluster}
	m.dynamic[key] = p
	timeout := DefaultInitialFetchTimeout
	if t := src.GetInitialFetchTimeout(); t != nil {
		timeout = t.AsDuration()
	}
	if timeout > 0 {
		time.AfterFunc(timeout, func() {
			if !p.Done() {
				m.log.Warn("secret not received within its initial fetch timeout", "secret", name, "timeout", timeout)
			}
			p.finish()
		})
	}
	go m.run(p, secretv3.NewSecretDiscoveryServiceClient(conn))
	return p, nil
}

// sourceCluster checks an SDS config source: gRPC (State of the World) to a static
// envoy_grpc cluster.
func (m *Manager) sourceCluster(src *corev3.ConfigSource) (string, error) {
	api := src.GetApiConfigSource()
	if api == nil {
		return "", fmt.Errorf("only api_config_source is supported for SDS, not %T", src.GetConfigSourceSpecifier())
	}
	if api.GetApiType() != corev3.ApiConfigSource_GRPC {
		return "", fmt.Errorf("api_type %s is not supported for SDS (GRPC only)", api.GetApiType())
	}
	if len(api.GetGrpcServices()) != 1 || api.GetGrpcServices()[0].GetEnvoyGrpc() == nil {
		return "", errors.New("want one grpc_services entry with envoy_grpc")
	}
	cluster := api.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	if !m.clusters.IsStatic(cluster) {
		return "", fmt.Errorf("envoy_grpc cluster %q is not a static cluster", cluster)
	}
	return cluster, nil
}

// conn is the gRPC channel to an SDS cluster (m.mu held).
func (m *Manager) conn(cluster string) (*grpc.ClientConn, error) {
	if c := m.conns[cluster]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient("passthrough:///"+cluster,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return m.clusters.Dial(ctx, cluster)
		}))
	if err != nil {
		return nil, fmt.Errorf("sds cluster %s: %w", cluster, err)
	}
	m.conns[cluster] = c
	go func() {
		<-m.ctx.Done()
		_ = c.Close()
	}()
	return c, nil
}

// run keeps a provider's stream open, reconnecting with jittered exponential back-off.
func (m *Manager) run(p *Provider, client secretv3.SecretDiscoveryServiceClient) {
	delay := backoffBase
	for m.ctx.Err() == nil {
		got, err := m.stream(p, client)
		if m.ctx.Err() != nil {
			return
		}
		if got {
			delay = backoffBase
		}
		m.log.Warn("SDS stream closed, reconnecting", "secret", p.Name, "cluster", p.Source, "err", err)
		wait := time.Duration(float64(delay) * (0.5 + rand.Float64()/2))
		select {
		case <-time.After(wait):
		case <-m.ctx.Done():
			return
		}
		delay = min(2*delay, backoffMax)
	}
}

// stream runs one StreamSecrets stream; got reports whether a response arrived.
func (m *Manager) stream(p *Provider, client secretv3.SecretDiscoveryServiceClient) (got bool, err error) {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	s, err := client.StreamSecrets(ctx)
	if err != nil {
		return false, err
	}
	version := ""
	if cur := p.Current(); cur != nil {
		version = cur.Version
	}
	req := &discoveryv3.DiscoveryRequest{Node: m.node, TypeUrl: resourcev3.SecretType, ResourceNames: []string{p.Name},
		VersionInfo: version}
	if err := s.Send(req); err != nil {
		return false, err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return got, err
		}
		got = true
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{p.Name},
			ResponseNonce: resp.GetNonce()}
		sec, err := accept(p.Name, resp)
		if err != nil {
			m.log.Warn("SDS update rejected", "secret", p.Name, "version", resp.GetVersionInfo(), "err", err)
			ack.VersionInfo = version
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			// A rejected update ends the initial wait as Envoy's SdsApi does (the
			// listener or cluster goes active without the secret; its handshakes fail);
			// a connection failure does not, only initial_fetch_timeout.
			p.finish()
		} else {
			version = resp.GetVersionInfo()
			sec.Version = version
			p.set(sec)
			ack.VersionInfo = version
			m.log.Info("secret updated", "secret", p.Name, "version", version)
		}
		if err := s.Send(ack); err != nil {
			return got, err
		}
	}
}

// accept checks an SDS response as Envoy's SdsApi does: exactly the secret asked for.
func accept(name string, resp *discoveryv3.DiscoveryResponse) (*Secret, error) {
	if resp.GetTypeUrl() != resourcev3.SecretType {
		return nil, fmt.Errorf("unexpected type %s", resp.GetTypeUrl())
	}
	if len(resp.GetResources()) == 0 {
		return nil, fmt.Errorf("Missing SDS resources for %s", name)
	}
	if len(resp.GetResources()) > 1 {
		return nil, fmt.Errorf("Unexpected SDS secrets length: %d", len(resp.GetResources()))
	}
	s := &tlsv3.Secret{}
	if err := resp.GetResources()[0].UnmarshalTo(s); err != nil {
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	if s.GetName() != name {
		return nil, fmt.Errorf("Unexpected SDS secret (expecting %s): %s", name, s.GetName())
	}
	return Compile(s)
}

// Dump lists the static secrets and the dynamic ones (with their current value, nil
// while warming), by name.
func (m *Manager) Dump() (static, dynamic []*Provider) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.static {
		static = append(static, p)
	}
	for _, p := range m.dynamic {
		dynamic = append(dynamic, p)
	}
	sort.Slice(static, func(i, j int) bool { return static[i].Name < static[j].Name })
	sort.Slice(dynamic, func(i, j int) bool { return dynamic[i].Name < dynamic[j].Name })
	return static, dynamic
}
