// Package admin is a client of the Envoy admin API, limited to the calls the agent makes
// (docs/contracts.md lists them), so the agent drives Envoy and the stand-in proxy alike.
package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to one proxy's admin address (host:port).
type Client struct {
	base string
	http *http.Client
}

// New returns a client of the admin API at addr. Each call is bounded by timeout unless
// its context ends sooner.
func New(addr string, timeout time.Duration) *Client {
	return &Client{
		base: "http://" + addr,
		http: &http.Client{Timeout: timeout, Transport: &http.Transport{
			// No connection reuse: during a hot restart the admin address moves from the
			// old epoch to the new one, and a kept-alive connection would still reach
			// the old process. Local connections are cheap.
			DisableKeepAlives:  true,
			DisableCompression: true,
		}},
	}
}

// Address is the admin's host:port.
func (c *Client) Address() string { return strings.TrimPrefix(c.base, "http://") }

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Do sends one request; path may carry a query. The body is read whole.
func (c *Client) Do(ctx context.Context, method, path string) (int, []byte, error) {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Stream sends a GET and returns the open response; the caller closes the body.
func (c *Client) Stream(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	return c.http.Do(req)
}

func (c *Client) post(ctx context.Context, path string) error {
	code, body, err := c.Do(ctx, http.MethodPost, path)
	if err != nil {
		return fmt.Errorf("admin POST %s: %w", path, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("admin POST %s: %d %s", path, code, strings.TrimSpace(string(body)))
	}
	return nil
}

// Ready asks GET /ready: Envoy answers 200 "LIVE" once initialized and 503 with the
// server state otherwise. It returns the state and whether it is LIVE.
func (c *Client) Ready(ctx context.Context) (string, bool, error) {
	code, body, err := c.Do(ctx, http.MethodGet, "/ready")
	if err != nil {
		return "", false, err
	}
	state := strings.TrimSpace(string(body))
	return state, code == http.StatusOK && state == "LIVE", nil
}

// ServerInfo is the part of GET /server_info the agent reads.
type ServerInfo struct {
	State              string `json:"state"`
	CommandLineOptions struct {
		RestartEpoch int `json:"restart_epoch"`
		// DrainTime and ParentShutdownTime are durations in protobuf's JSON form ("45s").
		DrainTime          string `json:"drain_time"`
		ParentShutdownTime string `json:"parent_shutdown_time"`
	} `json:"command_line_options"`
}

// ServerInfo reads GET /server_info.
func (c *Client) ServerInfo(ctx context.Context) (ServerInfo, error) {
	var si ServerInfo
	code, body, err := c.Do(ctx, http.MethodGet, "/server_info")
	if err != nil {
		return si, err
	}
	if code != http.StatusOK {
		return si, fmt.Errorf("admin /server_info: %d", code)
	}
	if err := json.Unmarshal(body, &si); err != nil {
		return si, fmt.Errorf("admin /server_info: %w", err)
	}
	return si, nil
}

// Listener is one entry of GET /listeners?format=json.
type Listener struct {
	Name    string
	Address string
	Port    int
}

// Listeners reads GET /listeners?format=json.
func (c *Client) Listeners(ctx context.Context) ([]Listener, error) {
	code, body, err := c.Do(ctx, http.MethodGet, "/listeners?format=json")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("admin /listeners: %d", code)
	}
	var doc struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("admin /listeners: %w", err)
	}
	out := make([]Listener, 0, len(doc.ListenerStatuses))
	for _, l := range doc.ListenerStatuses {
		out = append(out, Listener{Name: l.Name, Address: l.LocalAddress.SocketAddress.Address, Port: l.LocalAddress.SocketAddress.PortValue})
	}
	return out, nil
}

// Stats reads GET /stats?usedonly&filter=<regex> in Envoy's text form (name: value per
// line). Histograms, whose values are not numbers, are skipped.
func (c *Client) Stats(ctx context.Context, filter string) (map[string]int64, error) {
	path := "/stats?usedonly"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	code, body, err := c.Do(ctx, http.MethodGet, path)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("admin %s: %d", path, code)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		if err != nil {
			continue
		}
		out[strings.TrimSpace(name)] = n
	}
	return out, sc.Err()
}

// ActiveConnections sums downstream_cx_active over the proxy's listeners, leaving out
// the admin listener (whose count includes this very query). It returns -1 when the proxy
// reports no such stat (no connection was ever accepted, or stats are filtered), which
// Istio's agent treats as "nothing to wait for".
func (c *Client) ActiveConnections(ctx context.Context) (int64, error) {
	stats, err := c.Stats(ctx, "downstream_cx_active$")
	if err != nil {
		return 0, err
	}
	var sum int64
	found := false
	for name, v := range stats {
		if !strings.HasPrefix(name, "listener.") || strings.HasPrefix(name, "listener.admin.") {
			continue
		}
		found = true
		sum += v
	}
	if !found {
		return -1, nil
	}
	return sum, nil
}

// DrainListeners asks the proxy to stop accepting on its listeners:
// POST /drain_listeners?inboundonly&graceful as Istio's agent sends it on SIGTERM.
func (c *Client) DrainListeners(ctx context.Context) error {
	return c.post(ctx, "/drain_listeners?inboundonly&graceful")
}

// Quit asks the proxy to exit: POST /quitquitquit.
func (c *Client) Quit(ctx context.Context) error { return c.post(ctx, "/quitquitquit") }

// HealthcheckFail fails the proxy's health checks: POST /healthcheck/fail.
func (c *Client) HealthcheckFail(ctx context.Context) error { return c.post(ctx, "/healthcheck/fail") }
