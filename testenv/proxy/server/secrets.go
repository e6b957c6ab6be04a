package server

import (
	"context"
	"fmt"
	"net"

	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
)

// sdsClusters gives the secret manager the bootstrap's static clusters (Envoy requires an
// SDS source's cluster to be one) and connections to their hosts.
type sdsClusters struct{ s *Server }

func (c sdsClusters) IsStatic(name string) bool {
	for _, cl := range c.s.boot.GetStaticResources().GetClusters() {
		if cl.GetName() == name {
			return true
		}
	}
	return false
}

func (c sdsClusters) Dial(ctx context.Context, cluster string) (net.Conn, error) {
	cl := c.s.clusters.Get(cluster)
	if cl == nil {
		return nil, fmt.Errorf("sds cluster %s is not active", cluster)
	}
	h := cl.Choose(&upstream.LBContext{})
	if h == nil {
		return nil, fmt.Errorf("sds cluster %s has no hosts", cluster)
	}
	var d net.Dialer
	return d.DialContext(ctx, h.DialNetwork(), h.Address)
}

// newSecrets makes the secret manager with the bootstrap's static secrets.
func (s *Server) newSecrets() error {
	s.secrets = sds.NewManager(s.ctx, s.loggers.For("secret"), s.boot.GetNode(), sdsClusters{s})
	s.clusters.SetSecrets(s.secrets)
	for i, sec := range s.boot.GetStaticResources().GetSecrets() {
		if err := s.secrets.AddStatic(sec); err != nil {
			return fmt.Errorf("static_resources.secrets[%d]: %w", i, err)
		}
	}
	return nil
}
