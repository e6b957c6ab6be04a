package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

type hostView struct {
	Address  string
	Hostname string
}

// clusterHosts reads a cluster's hosts from /clusters?format=json.
func clusterHosts(t *testing.T, p *proxytest.Proxy, cluster string) []hostView {
	_, body := p.Get("/clusters?format=json")
	var doc struct {
		Clusters []struct {
			Name  string `json:"name"`
			Hosts []struct {
				Address struct {
					SA struct {
						Address string `json:"address"`
						Port    int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
				Hostname string `json:"hostname"`
			} `json:"host_statuses"`
		} `json:"cluster_statuses"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	var out []hostView
	for _, c := range doc.Clusters {
		if c.Name != cluster {
			continue
		}
		for _, h := range c.Hosts {
			out = append(out, hostView{Address: fmt.Sprintf("%s:%d", h.Address.SA.Address, h.Address.SA.Port), Hostname: h.Hostname})
		}
	}
	return out
}

func TestDNSAndOriginalDstClusters(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	b := newUpstream(t, "b", false, nil)
	_, port := a.hostPort()
	dns := func(name, typ string) string {
		return fmt.Sprintf(`
  - name: %s
    type: %s
    connect_timeout: 1s
    dns_lookup_family: V4_ONLY
    dns_refresh_rate: 1s
    load_assignment:
      cluster_name: %s
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: localhost, port_value: %d}}}`, name, typ, name, port)
	}
	origDst := `
  - name: orig
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    original_dst_lb_config: {use_http_header: true}`
	routes := routeYAML("/strict", `{cluster: strict}`) + routeYAML("/logical", `{cluster: logical}`) + routeYAML("/orig", `{cluster: orig}`)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(dns("strict", "STRICT_DNS")+dns("logical", "LOGICAL_DNS")+origDst,
		listenerYAML("main", "", routes, routerFilter))})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	for _, name := range []string{"strict", "logical"} {
		t.Run(name+" dns", func(t *testing.T) {
			r := do(t, c, "GET", base+"/"+name, "", nil)
			require.Equal(t, 200, r.code, r.body)
			assert.Equal(t, "a", r.header.Get("x-upstream"))
			hosts := clusterHosts(t, p, name)
			require.NotEmpty(t, hosts)
			for _, h := range hosts {
				assert.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), h.Address, "resolved, IPv4 only")
				assert.Equal(t, "localhost", h.Hostname)
			}
			if name == "logical" {
				assert.Len(t, hosts, 1, "LOGICAL_DNS has one host")
			}
		})
	}
	t.Run("original destination from x-envoy-original-dst-host", func(t *testing.T) {
		r := do(t, c, "GET", base+"/orig", "", map[string]string{"x-envoy-original-dst-host": addr(a)})
		assert.Equal(t, "a", r.header.Get("x-upstream"))
		r = do(t, c, "GET", base+"/orig", "", map[string]string{"x-envoy-original-dst-host": addr(b)})
		assert.Equal(t, "b", r.header.Get("x-upstream"))
	})
}

// echoServer answers every line with "<name>:<line>".
func echoServer(t *testing.T, name string) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s:%s\n", name, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return lis.Addr().String()
}

func tcpListenerYAML(name, proxy string) string {
	return `
  - name: ` + name + `
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: ` + name + proxy + "\n"
}

func TestTCPProxy(t *testing.T) {
	e1, e2 := echoServer(t, "e1"), echoServer(t, "e2")
	deadAddr := refusingAddr(t)
	clusters := staticCluster("e1", "", e1) + staticCluster("e2", "", e2) + staticCluster("flaky", "", deadAddr, e1)
	listeners := tcpListenerYAML("single", "\n          cluster: e1") +
		tcpListenerYAML("weighted", "\n          weighted_clusters: {clusters: [{name: e1, weight: 1}, {name: e2, weight: 1}]}") +
		tcpListenerYAML("retrying", "\n          cluster: flaky\n          max_connect_attempts: 3")
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(clusters, listeners)})

	roundTrip := func(t *testing.T, listener, line string) string {
		t.Helper()
		conn, err := net.DialTimeout("tcp", p.ListenerAddr(listener), 5*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		_, err = fmt.Fprintln(conn, line)
		require.NoError(t, err)
		got, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		return strings.TrimSpace(got)
	}
	t.Run("bytes both ways", func(t *testing.T) {
		assert.Equal(t, "e1:hello", roundTrip(t, "single", "hello"))
		assert.Equal(t, int64(1), p.Stat("tcp.single.downstream_cx_total"))
		assert.GreaterOrEqual(t, p.Stat("cluster.e1.upstream_cx_total"), int64(1))
	})
	t.Run("weighted clusters", func(t *testing.T) {
		seen := map[string]int{}
		for i := 0; i < 40; i++ {
			seen[strings.SplitN(roundTrip(t, "weighted", "x"), ":", 2)[0]]++
		}
		assert.Greater(t, seen["e1"], 5, "%v", seen)
		assert.Greater(t, seen["e2"], 5, "%v", seen)
	})
	t.Run("max_connect_attempts moves past a dead host", func(t *testing.T) {
		for i := 0; i < 6; i++ {
			assert.Equal(t, "e1:again", roundTrip(t, "retrying", "again"))
		}
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.upstream_cx_connect_fail"), int64(1))
	})
}

func TestConfigDumpResourceAndMask(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("a", "", addr(a))+staticCluster("b", "", addr(a)),
		listenerYAML("main", "", routeYAML("/", `{cluster: a}`), routerFilter))})
	type dump struct {
		Configs []map[string]any `json:"configs"`
	}
	get := func(q string) (int, dump) {
		code, body := p.Get("/config_dump" + q)
		var d dump
		if code == 200 {
			require.NoError(t, json.Unmarshal([]byte(body), &d), body)
		}
		return code, d
	}
	code, d := get("?resource=static_clusters")
	require.Equal(t, 200, code)
	require.Len(t, d.Configs, 2)
	for _, c := range d.Configs {
		assert.Equal(t, "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.StaticCluster", c["@type"])
		assert.Contains(t, c, "cluster")
	}
	code, d = get("?resource=static_clusters&mask=last_updated")
	require.Equal(t, 200, code)
	for _, c := range d.Configs {
		assert.NotContains(t, c, "cluster", "masked out")
		assert.Contains(t, c, "last_updated")
	}
	code, d = get("?mask=static_listeners,version_info")
	require.Equal(t, 200, code)
	for _, c := range d.Configs {
		for k := range c {
			assert.Contains(t, []string{"@type", "static_listeners", "version_info"}, k)
		}
		if c["@type"] == "type.googleapis.com/envoy.admin.v3.ListenersConfigDump" {
			assert.Contains(t, c, "static_listeners")
		}
	}
	code, _ = get("?resource=no_such_field")
	assert.Equal(t, 404, code)
}

func faultAny(t *testing.T, f *faultv3.HTTPFault) *anypb.Any {
	a, err := anypb.New(f)
	require.NoError(t, err)
	return a
}

func TestDeltaRemovals(t *testing.T) {
	up := newUpstream(t, "svc", false, nil)
	cp := newControlPlane(t, "")
	faultURL := "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"
	ecds := func(name string, dflt *anypb.Any) *hcmv3.HttpFilter {
		return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{ConfigDiscovery: &corev3.ExtensionConfigSource{
			ConfigSource: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
			DefaultConfig: dflt, TypeUrls: []string{faultURL},
		}}}
	}
	abort := faultAny(t, &faultv3.HTTPFault{Abort: &faultv3.FaultAbort{ErrorType: &faultv3.FaultAbort_HttpStatus{HttpStatus: 503},
		Percentage: &typev3.FractionalPercent{Numerator: 100}}})
	noFault := faultAny(t, &faultv3.HTTPFault{})
	base := map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("svc")},
		resourcev3.EndpointType: {endpoints("svc", addr(up))},
		resourcev3.ListenerType: {
			httpListener(t, "withdefault", "r1", corev3.TrafficDirection_OUTBOUND, ecds("f1", noFault)),
			httpListener(t, "nodefault", "r1", corev3.TrafficDirection_OUTBOUND, ecds("f2", nil)),
		},
	}
	v1 := map[resourcev3.Type][]types.Resource{resourcev3.RouteType: {routeTo("r1", "svc")},
		resourcev3.ExtensionConfigType: {typedExt("f1", abort), typedExt("f2", abort)}}
	for k, v := range base {
		v1[k] = v
	}
	cp.set("v1", v1)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: adsBootstrap(cp.addr, true)})
	c := client(t)
	with, without := "http://"+p.ListenerAddr("withdefault"), "http://"+p.ListenerAddr("nodefault")
	p.Eventually(10*time.Second, "the discovered fault config", func() bool {
		return do(t, c, "GET", with+"/", "", nil).code == 503 && do(t, c, "GET", without+"/", "", nil).code == 503
	})

	// v2 drops the extension configs and the route configuration.
	cp.set("v2", base)
	p.Eventually(10*time.Second, "ECDS removal applied", func() bool {
		return do(t, c, "GET", with+"/", "", nil).code == 200
	})
	assert.Equal(t, 200, do(t, c, "GET", with+"/", "", nil).code, "the default config after removal")
	r := do(t, c, "GET", without+"/", "", nil)
	assert.Equal(t, 500, r.code, "no default: the filter has no config (NFCF)")
	_, dumpBody := p.Get("/config_dump")
	assert.NotContains(t, dumpBody, `"ecds_filters"`, "removed extension configs leave the dump")
	assert.Regexp(t, `"route_config":\s*\{[^{]*"name":\s*"r1"`, dumpBody, "a removed route configuration is kept, as Envoy ignores RDS removals")
}
