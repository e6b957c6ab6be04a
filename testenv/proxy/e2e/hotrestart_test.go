package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// load sends requests to target from 4 clients (two with keep-alive, two without) until
// stopped, counting what succeeded and what did not.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	firstErrs  []string
	stop       context.CancelFunc
	wg         sync.WaitGroup
}

func startLoad(target string) *load {
	ctx, stop := context.WithCancel(context.Background())
	l := &load{stop: stop}
	for i := 0; i < 4; i++ {
		keepAlive := i%2 == 0
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 4}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			deadline := time.Now().Add(60 * time.Second) // bounded even if the test stalls
			for ctx.Err() == nil && time.Now().Before(deadline) {
				resp, err := c.Get(target)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.firstErrs) < 5 {
						l.firstErrs = append(l.firstErrs, fmt.Sprint(err, resp))
					}
					l.mu.Unlock()
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	return l
}

// end stops the clients and checks that no request failed.
func (l *load) end(t *testing.T) {
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Zero(t, l.failed.Load(), "failed requests during the handover: %v", l.firstErrs)
	t.Logf("requests: %d ok, %d failed", l.ok.Load(), l.failed.Load())
}

// restartDomain is one hot-restart domain (a base id and a working directory).
type restartDomain struct {
	t      *testing.T
	baseID string
	dir    string
}

func newRestartDomain(t *testing.T, offset int) restartDomain {
	return restartDomain{t: t, baseID: strconv.Itoa(os.Getpid()%100000 + offset), dir: t.TempDir()}
}

// start starts an epoch of the domain, waiting for LIVE unless noWait.
func (d restartDomain) start(boot string, epoch int, noWait bool) *proxytest.Proxy {
	return proxytest.Start(d.t, proxytest.Options{Bootstrap: boot, Dir: d.dir, NoWait: noWait,
		Args: []string{"--base-id", d.baseID, "--restart-epoch", strconv.Itoa(epoch), "--drain-time-s", "1", "--parent-shutdown-time-s", "2"}})
}

// underLoad starts epoch 0 and load through its inbound listener; it returns the listener's
// address.
func (d restartDomain) underLoad(boot string) (*proxytest.Proxy, string, *load) {
	p0 := d.start(boot, 0, false)
	inbound := p0.ListenerAddr("inbound")
	ld := startLoad("http://" + inbound + "/")
	d.t.Cleanup(ld.stop)
	p0.Eventually(10*time.Second, "load through epoch 0", func() bool { return ld.ok.Load() > 50 })
	return p0, inbound, ld
}

// handedOver waits for the parent to exit and load to flow through the child alone, then
// ends the load and checks that nothing failed and the child serves the parent's socket.
func handedOver(t *testing.T, p0, p1 *proxytest.Proxy, inbound string, ld *load) {
	require.True(t, p0.Wait(20*time.Second), "epoch 0 exits after the parent shutdown time")
	before := ld.ok.Load()
	p1.Eventually(10*time.Second, "load through epoch 1 alone", func() bool { return ld.ok.Load() > before+100 })
	ld.end(t)
	assert.Equal(t, inbound, p1.ListenerAddr("inbound"), "the child serves the parent's socket")
}

func TestHotRestartUnderLoad(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	boot := twoListenerBootstrap(up)
	d := newRestartDomain(t, 100000)
	p0, inbound, ld := d.underLoad(boot)
	p1 := d.start(boot, 1, false)
	handedOver(t, p0, p1, inbound, ld)
	assert.Greater(t, p1.Stat("http.inbound.downstream_rq_total"), int64(0))
}

// TestHotRestartChildAcceptsOnceLive: the next epoch takes the listening sockets at once
// but, as Envoy's workers, accepts on them only once it is initialized; until then the
// previous epoch serves every connection. Here the child's cluster waits for its endpoints
// from the control plane, which sends them only after the child asked for them (it holds
// the sockets by then) and 50 more requests succeeded: a connection the child took
// meanwhile would fail (its cluster has no endpoints yet). The child serves the admin API
// from its start, as Envoy's child shuts down its parent's admin listener.
func TestHotRestartChildAcceptsOnceLive(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	boot := twoListenerBootstrap(up)
	cp := newControlPlane(t, "")
	static := staticCluster("up", "", addr(up))
	require.Contains(t, boot, static)
	childBoot := `node: {id: "` + testNode + `", cluster: ads.default}
dynamic_resources:
  ads_config: {api_type: GRPC, transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: xds-grpc}}]}
` + strings.Replace(boot, static, `
  - name: up
    type: EDS
    connect_timeout: 1s
    eds_cluster_config: {eds_config: {ads: {}, resource_api_version: V3}}`+staticCluster("xds-grpc", h2ProtocolOptions, cp.addr), 1)
	d := newRestartDomain(t, 110000)
	p0, inbound, ld := d.underLoad(boot)

	p1 := d.start(childBoot, 1, true)
	// The child took the parent's sockets before it started initializing, and asks for
	// its cluster's endpoints while it initializes.
	p1.Eventually(10*time.Second, "the child's EDS request", func() bool { return cp.requested(resourcev3.EndpointType) > 0 })
	for i := 0; i < 5; i++ { // each admin connection is the child's
		code, body := p1.Get("/ready")
		assert.Equal(t, "INITIALIZING", strings.TrimSpace(body), "the child waits for its endpoints (HTTP %d)", code)
	}
	before := ld.ok.Load()
	p0.Eventually(5*time.Second, "epoch 0 still serving", func() bool { return ld.ok.Load() > before+50 })
	cp.set("1", map[resourcev3.Type][]types.Resource{resourcev3.EndpointType: {endpoints("up", addr(up))}})
	p1.WaitReady(10 * time.Second)
	handedOver(t, p0, p1, inbound, ld)
}
