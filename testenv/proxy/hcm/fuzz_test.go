package hcm_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/testenv/proxy/server"
)

// fuzzBootstrap is a meshproxy with one HTTP listener whose every route answers 200 "ok".
const fuzzBootstrap = `
node: {id: fuzz, cluster: fuzz}
static_resources:
  listeners:
  - name: http
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: fuzz
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                direct_response: {status: 200, body: {inline_string: ok}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
`

// lockedBuffer collects what the proxy and net/http log (a recovered handler panic among it).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// exchange writes raw bytes on a new loopback connection, half-closes it and returns all the
// proxy writes back within a short deadline.
func exchange(t *testing.T, addr string, raw []byte) []byte {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(raw) // the proxy may close before it read everything
	_ = c.(*net.TCPConn).CloseWrite()
	out, _ := io.ReadAll(c)
	return out
}

// FuzzHTTP1Request sends hostile bytes to a live in-process meshproxy's HTTP listener over
// loopback: it never panics, whatever it answers is a well-formed HTTP/1 response (a 400 for
// what does not parse), and afterwards a plain GET still gets 200.
func FuzzHTTP1Request(f *testing.F) {
	logs, was := &lockedBuffer{}, log.Writer()
	log.SetOutput(logs) // net/http reports a recovered handler panic through the std logger
	f.Cleanup(func() { log.SetOutput(was) })
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	s, err := server.New(ctx, server.Options{ConfigYAML: fuzzBootstrap, Concurrency: 1, Stdout: io.Discard, Stderr: logs})
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Start(); err != nil {
		f.Fatal(err)
	}
	ls := s.Listeners()
	if len(ls) != 1 {
		f.Fatalf("listeners: %+v", ls)
	}
	addr := ls[0].Address
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
		"GET /\x00 HTTP/1.1\r\nHost: \xff\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("y", 70000) + "\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET http://[::1 HTTP/1.0\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		out := exchange(t, addr, raw)
		h2 := bytes.HasPrefix(raw, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) // prior-knowledge h2c: frames back
		if len(out) > 0 && !h2 {
			r, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
			if err != nil {
				t.Fatalf("the proxy answered what is not an HTTP/1 response (%v): %q", err, out)
			}
			r.Body.Close()
		}
		if strings.Contains(logs.String(), "panic") {
			t.Fatalf("the proxy panicked:\n%s", logs.String())
		}
		got := exchange(t, addr, []byte("GET / HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n"))
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 200 ")) || !bytes.HasSuffix(got, []byte("ok")) {
			t.Fatalf("after the input a plain GET gets %q", got)
		}
	})
}
