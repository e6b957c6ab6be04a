package e2e

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
	"github.com/wasmesh/wasmesh/testenv/meshview"
)

// browser starts headless Chromium (Debian's, installed by `make tools`) for the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if meshtest.RequireFixtures() {
			t.Fatalf("chromium not found (%v): `make tools` installs Debian's chromium", err)
		}
		t.Skipf("chromium not found (%v): `make tools` installs Debian's chromium", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin),
		chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1100, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "starting chromium")
	return ctx
}

// The mesh page in a real browser: it draws the sample's workloads and the calls between
// them with their rates (mutual TLS on the edges between sidecars), lists every proxy as
// SYNCED, and a config file written broken appears among the rejected, with its file and
// field, without reloading the page. A screenshot is kept in build/screenshots.
func TestMeshPageInABrowser(t *testing.T) {
	bctx := browser(t)
	m, _, prom := sampleMeshWithPrometheus(t, 30)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: meshview.Handler(m.ViewSources(prom)), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	page := "http://" + l.Addr().String() + "/"

	tctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, chromedp.Do(tctx, chromedp.Navigate(page)))
	// What the page shows, read in the browser: an element's text and an attribute ("" when
	// the element is not there yet).
	eval := func(js string) string {
		v, err := chromedp.Run(tctx, chromedp.Evaluate[string](js))
		if err != nil {
			return ""
		}
		return v
	}
	text := func(sel string) string {
		return eval(`(document.querySelector(` + strconv.Quote(sel) + `) || {}).textContent || ""`)
	}
	attr := func(sel, name string) string {
		return eval(`((document.querySelector(` + strconv.Quote(sel) + `) || {getAttribute: () => ""}).getAttribute(` + strconv.Quote(name) + `)) || ""`)
	}

	for _, w := range []string{"productpage-v1", "reviews-v1", "reviews-v2", "ratings-v1"} {
		assert.Eventually(t, func() bool { return strings.Contains(text(`[data-node="`+w+`"]`), w) },
			30*time.Second, 200*time.Millisecond, "node %s drawn", w)
	}
	for _, e := range []string{"productpage-v1->reviews-v1", "productpage-v1->reviews-v2", "reviews-v2->ratings-v1"} {
		sel := `[data-edge="` + e + `"]`
		assert.Eventually(t, func() bool { return strings.Contains(text(sel), "rps") && attr(sel, "data-mtls") == "true" },
			time.Minute, 250*time.Millisecond, "edge %s drawn with its rate, over mutual TLS", e)
		t.Logf("edge %s: %s", e, text(sel))
	}
	t.Logf("page: %s; problems: %q", text("#updated"), text("#problems"))
	for _, p := range m.Pods() {
		sel := `[data-proxy="` + p.Spec.Name + "." + p.Spec.Namespace + `"]`
		assert.Eventually(t, func() bool {
			row := text(sel)
			return strings.Count(row, "SYNCED") >= 4 && !strings.Contains(row, "STALE")
		}, 30*time.Second, 200*time.Millisecond, "proxy %s listed as synced", p.Spec.Name)
	}
	assert.Contains(t, text("#rejected"), "none")

	// A broken file appears among the rejected, live.
	require.NoError(t, m.WriteConfig("broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"+
		"metadata: {name: broken, namespace: default}\nspec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}, weight: -5}]}]}\n"))
	assert.Eventually(t, func() bool {
		r := text(`#rejected [data-file="broken.yaml"]`)
		return strings.Contains(r, "weight")
	}, 30*time.Second, 200*time.Millisecond, "the rejected file is shown with its field")
	t.Logf("rejected: %s", text("#rejected"))

	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	require.NoError(t, err)
	dir := filepath.Join(meshtest.Root(), "build", "screenshots")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mesh-page.png"), shot, 0o644))
	t.Logf("screenshot: %s (%d bytes)", filepath.Join(dir, "mesh-page.png"), len(shot))
}
