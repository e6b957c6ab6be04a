package main

import (
	"fmt"
	"net"
	"strconv"
)

// bootstrapDoc is the part of an Envoy v3 bootstrap the test proxy reads.
type bootstrapDoc struct {
	Admin struct {
		Address addressDoc `json:"address"`
	} `json:"admin"`
	StatsConfig struct {
		StatsTags []struct {
			TagName string `json:"tag_name"`
			Regex   string `json:"regex"`
		} `json:"stats_tags"`
	} `json:"stats_config"`
	StaticResources struct {
		Listeners []struct {
			Name         string     `json:"name"`
			Address      addressDoc `json:"address"`
			FilterChains []struct {
				Filters []struct {
					TypedConfig struct {
						StatPrefix  string `json:"stat_prefix"`
						RouteConfig struct {
							VirtualHosts []struct {
								Routes []struct {
									Match struct {
										Prefix string `json:"prefix"`
										Path   string `json:"path"`
									} `json:"match"`
									Route struct {
										Cluster string `json:"cluster"`
									} `json:"route"`
								} `json:"routes"`
							} `json:"virtual_hosts"`
						} `json:"route_config"`
					} `json:"typed_config"`
				} `json:"filters"`
			} `json:"filter_chains"`
		} `json:"listeners"`
		Clusters []struct {
			Name           string `json:"name"`
			LoadAssignment struct {
				Endpoints []struct {
					LbEndpoints []struct {
						Endpoint struct {
							Address addressDoc `json:"address"`
						} `json:"endpoint"`
					} `json:"lb_endpoints"`
				} `json:"endpoints"`
			} `json:"load_assignment"`
		} `json:"clusters"`
	} `json:"static_resources"`
}

type addressDoc struct {
	SocketAddress struct {
		Address   string `json:"address"`
		PortValue int    `json:"port_value"`
	} `json:"socket_address"`
}

func (a addressDoc) hostPort() (string, error) {
	if a.SocketAddress.Address == "" {
		return "", fmt.Errorf("no socket_address")
	}
	return net.JoinHostPort(a.SocketAddress.Address, strconv.Itoa(a.SocketAddress.PortValue)), nil
}

type route struct {
	prefix  string
	exact   bool
	cluster string
}

// clusterAddrs maps each static cluster to its first endpoint.
func (b *bootstrapDoc) clusterAddrs() map[string]string {
	out := map[string]string{}
	for _, c := range b.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, le := range e.LbEndpoints {
				if hp, err := le.Endpoint.Address.hostPort(); err == nil {
					if _, ok := out[c.Name]; !ok {
						out[c.Name] = hp
					}
				}
			}
		}
	}
	return out
}
