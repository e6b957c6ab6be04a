package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// kitchenWasm builds the wasm host's test guest, whose behaviour per request is chosen by
// the x-op request header (buffer-body, append-body, resp-buffer, pause, ...).
func kitchenWasm(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "..", "wasm", "host", "testdata", "guests", "kitchen")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	art, err := wasmbuild.Build(ctx, dir, wasmbuild.Options{})
	require.NoError(t, err)
	return art.Path
}

// propInt decodes a property the guest logged as "x-prop-<name>=<status>:<hex>" (an int64,
// little endian).
func propInt(t *testing.T, log, name string) (int64, bool) {
	m := regexp.MustCompile(`x-prop-`+regexp.QuoteMeta(name)+`=0:([0-9a-f]{16})`).FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0, false
	}
	b, err := hex.DecodeString(m[len(m)-1][1])
	require.NoError(t, err)
	return int64(binary.LittleEndian.Uint64(b)), true
}

func TestWasmBodies(t *testing.T) {
	kitchen := kitchenWasm(t)
	up := newUpstream(t, "up", false, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("x-got-body", string(b[:min(len(b), 64)]))
		w.Header().Set("x-got-len", strconv.Itoa(len(b)))
		if r.URL.Query().Get("chunked") != "" {
			// No content-length: a filter may change the body's length (with Envoy too, a
			// filter that does must not leave a content-length behind).
			w.(http.Flusher).Flush()
		}
		if n, err := strconv.Atoi(r.URL.Query().Get("resp")); err == nil {
			_, _ = w.Write(bytes.Repeat([]byte("r"), n))
			return
		}
		_, _ = w.Write([]byte("hello"))
	})
	wasm := `
          - name: kitchen
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: kitchen
                root_id: kitchen
                allow_on_headers_stop_iteration: true
                configuration: {"@type": type.googleapis.com/google.protobuf.StringValue, value: ""}
                vm_config:
                  vm_id: kitchen
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: ` + kitchen + `}}`
	listeners := listenerYAML("main", "", routeYAML("/", `{cluster: up}`), httpFilters(wasm)) +
		`    per_connection_buffer_limit_bytes: 4096` + "\n"
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("up", "", addr(up)), listeners)})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	t.Run("request body buffered and rewritten at the end of the stream", func(t *testing.T) {
		r := doBody(t, c, "POST", base+"/", []byte("hello body"), map[string]string{"x-op": "buffer-body"})
		require.Equal(t, 200, r.code, r.body)
		assert.Equal(t, "HELLO BODY", r.header.Get("x-got-body"))
	})
	t.Run("response body modified at the end of the stream", func(t *testing.T) {
		// resp-body appends to the chunk that ends the stream; the upstream sends no
		// content-length, since the guest changes the body's length.
		r := do(t, c, "GET", base+"/?chunked=1", "", map[string]string{"x-op": "resp-body"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "hello world", r.body)
	})
	t.Run("response body buffered and rewritten", func(t *testing.T) {
		r := do(t, c, "GET", base+"/?chunked=1", "", map[string]string{"x-op": "resp-buffer"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "[hello]", r.body)
	})
	t.Run("paused headers receive the body and continue with it", func(t *testing.T) {
		// "pause" stops the headers; buffer-body continues at the end of the body, which
		// releases the headers with the rewritten body.
		r := doBody(t, c, "POST", base+"/", []byte("paused"), map[string]string{"x-op": "pause,buffer-body"})
		require.Equal(t, 200, r.code, r.body)
		assert.Equal(t, "PAUSED", r.header.Get("x-got-body"))
	})
	t.Run("buffering past the buffer limit: 413", func(t *testing.T) {
		r := doBody(t, c, "POST", base+"/", bytes.Repeat([]byte("x"), 64*1024), map[string]string{"x-op": "buffer-body"})
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.code)
		assert.Equal(t, "Payload Too Large", r.body)
	})
	t.Run("buffering a response past the limit after its headers: reset", func(t *testing.T) {
		resp, err := c.Get(base + "/?resp=65536")
		require.NoError(t, err)
		resp.Body.Close()
		req, _ := http.NewRequest("GET", base+"/?resp=65536", nil)
		req.Header.Set("x-op", "resp-buffer")
		resp, err = c.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		assert.Error(t, err, "the stream is reset")
	})
	t.Run("request.total_size and response.total_size count the bodies", func(t *testing.T) {
		body := bytes.Repeat([]byte("b"), 3000)
		r := doBody(t, c, "POST", base+"/?resp=3500", body, map[string]string{"x-log-props": "request.total_size;response.total_size;request.size"})
		require.Equal(t, 200, r.code)
		var reqTotal, respTotal int64
		p.Eventually(10*time.Second, "the guest's access log line", func() bool {
			var ok1, ok2 bool
			reqTotal, ok1 = propInt(t, p.Stderr(), "request.total_size")
			respTotal, ok2 = propInt(t, p.Stderr(), "response.total_size")
			return ok1 && ok2
		})
		assert.Greater(t, reqTotal, int64(3000), "headers and the 3000-byte body")
		assert.Less(t, reqTotal, int64(3000+1024))
		assert.Greater(t, respTotal, int64(3500), "headers and the 3500-byte body")
		assert.Less(t, respTotal, int64(3500+1024))
		size, _ := propInt(t, p.Stderr(), "request.size")
		assert.Equal(t, int64(3000), size)
	})
}

// A body whose length is known ends on its last chunk at every filter of a chain, as with
// Envoy (its codec ends the stream on the last data frame): the second Wasm filter gets
// the last bytes with end_of_stream, not the bytes and then an empty callback.
func TestWasmBodyEndsOnItsLastChunk(t *testing.T) {
	kitchen := kitchenWasm(t)
	up := newUpstream(t, "up", false, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-length", "5")
		_, _ = w.Write([]byte("hello"))
	})
	listeners := listenerYAML("main", "", routeYAML("/", `{cluster: up}`), httpFilters(wasmFilterYAML("first", kitchen, "")+wasmFilterYAML("second", kitchen, "")))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("up", "", addr(up)), listeners)})
	r := doBody(t, client(t), "POST", "http://"+p.ListenerAddr("main")+"/", []byte("abc"), map[string]string{"x-op": "log-body"})
	require.Equal(t, 200, r.code, r.body)
	require.Equal(t, "hello", r.body)

	callbacks := regexp.MustCompile(`x-body-callback (\w+ size=\d+ eos=\d+)`)
	var got []string
	p.Eventually(10*time.Second, "both filters' body callbacks in the log", func() bool {
		got = got[:0]
		for _, m := range callbacks.FindAllStringSubmatch(p.Stderr(), -1) {
			got = append(got, m[1])
		}
		return len(got) >= 4
	})
	assert.ElementsMatch(t, []string{
		"request size=3 eos=1", "request size=3 eos=1",
		"response size=5 eos=1", "response size=5 eos=1",
	}, got, "one callback per filter and direction, the last bytes with end_of_stream")
}
