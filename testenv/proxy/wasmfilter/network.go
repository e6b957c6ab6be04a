package wasmfilter

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	wasmnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/listener"
	"github.com/wasmesh/wasmesh/testenv/proxy/rbac"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// NetworkTypeURL is the Wasm network filter's type URL.
const NetworkTypeURL = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"

// NetworkFactory builds envoy.filters.network.wasm: each connection of the chain is a
// host.NetworkStream of the plugin, which sees the bytes both ways (proxy_on_downstream_data
// as the terminal filter reads them from the client, proxy_on_upstream_data as it writes
// the server's answer back) and the connection's end (proxy_on_downstream/upstream_
// connection_close, then proxy_on_done, proxy_on_log, proxy_on_delete, Envoy's order).
//
// What a guest does with the data is honoured as far as a byte stream allows: the bytes it
// leaves in the buffer are what go on, and a StopIteration holds them until a later callback
// continues. A guest that cannot start a connection fails it (closes it), unless the plugin
// fails open.
func (m *Manager) NetworkFactory(li hcm.ListenerInfo, name string, a *anypb.Any) (func(listener.NetworkFilter) listener.NetworkFilter, error) {
	p, failOpen, err := m.pluginOf(name, a, &wasmnetv3.Wasm{})
	if err != nil {
		return nil, err
	}
	failures := m.opts.Store.Scope("wasm." + p.Name()).Counter("failed_connections")
	return func(next listener.NetworkFilter) listener.NetworkFilter {
		return &networkFilter{NetworkFilter: next, plugin: p, failOpen: failOpen, failures: failures, direction: li.Direction}
	}, nil
}

// networkFilter runs each connection through the plugin before the next filter.
type networkFilter struct {
	listener.NetworkFilter
	plugin    *host.Plugin
	failOpen  bool
	failures  *stats.Counter
	direction int
}

func (f *networkFilter) ServeConn(conn net.Conn) {
	info := host.StreamInfo{
		Protocol:    "tcp",
		StartTime:   time.Now(),
		Source:      host.Address(conn.RemoteAddr().String()),
		Destination: host.Address(conn.LocalAddr().String()),
		Properties:  map[string]any{"listener_direction": int64(f.direction)},
		Connection:  connectionInfo(rbac.ConnTLS(conn)),
	}
	ctx := context.Background()
	st, err := f.plugin.NewNetworkStream(ctx, host.StreamOptions{Info: info})
	if err != nil {
		f.failures.Inc()
		if f.failOpen {
			f.NetworkFilter.ServeConn(conn)
			return
		}
		_ = conn.Close()
		return
	}
	c := &wasmConn{Conn: conn, stream: st, failures: f.failures}
	c.mu.Lock()
	res := st.OnNewConnection(ctx)
	c.mu.Unlock()
	if err := c.check(res); err != nil {
		_ = c.Close()
		return
	}
	f.NetworkFilter.ServeConn(c)
}

// errFilterFailed is what reads and writes return once the guest failed closed.
var errFilterFailed = errors.New("wasm network filter failed")

// wasmConn is the downstream connection as the terminal filter sees it: what it reads
// has been through proxy_on_downstream_data, what it writes through proxy_on_upstream_data.
type wasmConn struct {
	net.Conn
	mu       sync.Mutex // the stream's callbacks, one at a time
	stream   *host.NetworkStream
	failures *stats.Counter
	pending  []byte // downstream data passed by the guest, not yet read
	readEOF  bool
	once     sync.Once
}

// check counts a guest failure; a failure that did not fail open ends the connection.
// A StopIteration from proxy_on_new_connection is taken as Continue: connections here
// do not wait to start.
func (c *wasmConn) check(res host.Result) error {
	if res.Failure == nil {
		return nil
	}
	c.failures.Inc()
	if res.Action != host.Continue {
		return errFilterFailed
	}
	return nil
}

// data runs one chunk through the guest and returns what goes on.
func (c *wasmConn) data(down bool, b []byte, eos bool) ([]byte, error) {
	ctx := context.Background()
	c.mu.Lock()
	var res host.Result
	if down {
		res = c.stream.OnDownstreamData(ctx, b, eos)
	} else {
		res = c.stream.OnUpstreamData(ctx, b, eos)
	}
	c.mu.Unlock()
	if err := c.check(res); err != nil {
		return nil, err
	}
	if res.Action != host.Continue {
		return nil, nil // held by the guest until a later callback continues
	}
	return res.Body, nil
}

func (c *wasmConn) Read(b []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.readEOF {
			return 0, io.EOF
		}
		n, err := c.Conn.Read(b)
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return 0, err
		}
		if n > 0 || eof {
			out, ferr := c.data(true, b[:n], eof)
			if ferr != nil {
				return 0, ferr
			}
			c.pending = append(c.pending, out...)
		}
		c.readEOF = eof
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *wasmConn) Write(b []byte) (int, error) {
	out, err := c.data(false, b, false)
	if err != nil {
		return 0, err
	}
	if len(out) > 0 {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// CloseWrite is the upstream's end of stream: the guest sees it, then the client does.
func (c *wasmConn) CloseWrite() error {
	out, err := c.data(false, nil, true)
	if err != nil {
		return err
	}
	if len(out) > 0 {
		if _, err := c.Conn.Write(out); err != nil {
			return err
		}
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// UpstreamChosen gives the guest the connection's cluster and upstream attributes.
func (c *wasmConn) UpstreamChosen(cluster string, up net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stream.UpdateInfo(func(i *host.StreamInfo) {
		i.ClusterName = cluster
		i.Upstream.Address = host.Address(up.RemoteAddr().String())
		i.Upstream.LocalAddress = host.Address(up.LocalAddr().String())
		upstreamInfo(&i.Upstream, upstream.ConnTLS(up))
	})
}

// Close ends the connection for the guest once: both sides closed (the proxy closes the
// two together), then the stream is done.
func (c *wasmConn) Close() error {
	c.once.Do(func() {
		ctx := context.Background()
		c.mu.Lock()
		c.stream.OnDownstreamClose(ctx, host.PeerLocal)
		c.stream.OnUpstreamClose(ctx, host.PeerLocal)
		c.stream.Finish(ctx)
		c.mu.Unlock()
	})
	return c.Conn.Close()
}
