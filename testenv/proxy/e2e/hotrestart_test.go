package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

func TestHotRestartUnderLoad(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	boot := twoListenerBootstrap(up)
	baseID := strconv.Itoa(os.Getpid()%100000 + 100000)
	dir := t.TempDir()
	p0 := proxytest.Start(t, proxytest.Options{Bootstrap: boot, Dir: dir,
		Args: []string{"--base-id", baseID, "--restart-epoch", "0", "--drain-time-s", "1", "--parent-shutdown-time-s", "2"}})
	inbound := p0.ListenerAddr("inbound")
	target := "http://" + inbound + "/"

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var ok, failed atomic.Int64
	var errMu sync.Mutex
	var firstErrs []string
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		keepAlive := i%2 == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
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
					failed.Add(1)
					errMu.Lock()
					if len(firstErrs) < 5 {
						firstErrs = append(firstErrs, fmt.Sprint(err, resp))
					}
					errMu.Unlock()
					continue
				}
				ok.Add(1)
			}
		}()
	}
	p0.Eventually(10*time.Second, "load through epoch 0", func() bool { return ok.Load() > 50 })

	p1 := proxytest.Start(t, proxytest.Options{Bootstrap: boot, Dir: dir,
		Args: []string{"--base-id", baseID, "--restart-epoch", "1", "--drain-time-s", "1", "--parent-shutdown-time-s", "2"}})
	require.True(t, p0.Wait(20*time.Second), "epoch 0 exits after the parent shutdown time")
	before := ok.Load()
	p1.Eventually(10*time.Second, "load through epoch 1 alone", func() bool { return ok.Load() > before+100 })
	stop()
	wg.Wait()

	assert.Zero(t, failed.Load(), "failed requests during the handover: %v", firstErrs)
	assert.Equal(t, inbound, p1.ListenerAddr("inbound"), "the child serves the parent's socket")
	assert.Greater(t, p1.Stat("http.inbound.downstream_rq_total"), int64(0))
	t.Logf("requests: %d ok, %d failed", ok.Load(), failed.Load())
}
