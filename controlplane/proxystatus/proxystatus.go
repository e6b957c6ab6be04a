// Package proxystatus is what `meshctl proxy-status` shows: the proxies connected to one or
// more discovery replicas (their /debug/syncz pages, merged), and per xDS type whether the
// proxy is SYNCED, STALE or NOT SENT, as istioctl proxy-status says it.
package proxystatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/wasmesh/wasmesh/controlplane/debug"
	"github.com/wasmesh/wasmesh/controlplane/server"
)

// Types are the columns of the table, istioctl's order.
var Types = []string{"cds", "lds", "eds", "rds", "ecds"}

// Statuses, istioctl's words.
const (
	Synced  = "SYNCED"
	Stale   = "STALE"
	NotSent = "NOT SENT"
)

// Proxy is one connection as a discovery replica reports it, with the address it was read
// from.
type Proxy struct {
	debug.SyncStatus
	DiscoveryAddress string `json:"discoveryAddress"`
}

// Replica names the discovery replica serving the proxy: its instance name, else the address
// it was asked at.
func (p Proxy) Replica() string {
	if p.Discovery != "" {
		return p.Discovery
	}
	return p.DiscoveryAddress
}

// Pod is the proxy's pod as istioctl names it, <name>.<namespace>.
func (p Proxy) Pod() string { return p.Name + "." + p.Namespace }

// TypeState is one type's state for one proxy.
type TypeState struct {
	Type   string `json:"type"`
	Status string `json:"status"`
	// NackError is the proxy's error for the version it rejected, when that is the version
	// last sent.
	NackError    string `json:"nackError,omitempty"`
	VersionSent  string `json:"versionSent,omitempty"`
	VersionAcked string `json:"versionAcked,omitempty"`
}

// State says where a type stands: NOT SENT before discovery sent anything of it, SYNCED
// when the proxy acked the latest response (by its nonce), else STALE (sent and not yet
// answered, or NACKed: then with the proxy's error).
func State(t server.TypeStatus) TypeState {
	st := TypeState{Type: t.Type, VersionSent: t.VersionSent, VersionAcked: t.VersionAcked}
	switch {
	case t.NonceSent == "":
		st.Status = NotSent
	case t.NonceAcked == t.NonceSent:
		st.Status = Synced
	default:
		st.Status = Stale
		if t.NackError != "" && t.VersionNacked == t.VersionSent {
			st.NackError = t.NackError
		}
	}
	return st
}

// States are the proxy's states in Types order; a type the proxy never asked for is NOT SENT.
func (p Proxy) States() []TypeState {
	byType := map[string]server.TypeStatus{}
	for _, t := range p.Types {
		byType[t.Type] = t
	}
	out := make([]TypeState, 0, len(Types))
	for _, typ := range Types {
		t, ok := byType[typ]
		if !ok {
			out = append(out, TypeState{Type: typ, Status: NotSent})
			continue
		}
		out = append(out, State(t))
	}
	return out
}

// BaseURL turns a --discoveryAddress (host:port or an http(s) URL) into a URL to add paths to.
func BaseURL(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return "", errors.New("empty discovery address")
	}
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return strings.TrimSuffix(addr, "/"), nil
	}
	if strings.Contains(addr, "/") {
		return "", fmt.Errorf("discovery address %q: want host:port or an http(s) URL", addr)
	}
	return "http://" + addr, nil
}

// Fetch reads /debug/syncz from every address and merges the proxies, sorted by pod and
// replica. Any replica that cannot be read is an error naming it: a partial table would
// hide proxies.
func Fetch(ctx context.Context, c *http.Client, addrs []string) ([]Proxy, error) {
	var out []Proxy
	seen := map[string]bool{}
	for _, addr := range addrs {
		base, err := BaseURL(addr)
		if err != nil {
			return nil, err
		}
		if seen[base] {
			continue
		}
		seen[base] = true
		var list []debug.SyncStatus
		if err := GetJSON(ctx, c, base+"/debug/syncz", &list); err != nil {
			return nil, fmt.Errorf("discovery %s: %w", addr, err)
		}
		for _, s := range list {
			out = append(out, Proxy{SyncStatus: s, DiscoveryAddress: addr})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Pod() != out[j].Pod() {
			return out[i].Pod() < out[j].Pod()
		}
		return out[i].Replica() < out[j].Replica()
	})
	return out, nil
}

// GetJSON GETs url and decodes its JSON body into v; a status other than 200 is an error
// with the body's first line.
func GetJSON(ctx context.Context, c *http.Client, url string, v any) error {
	body, err := Get(ctx, c, url)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: not the JSON expected: %w", url, err)
	}
	return nil
}

// Get GETs url and returns its body; a status other than 200 is an error.
func Get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, line)
	}
	return body, nil
}

// Find picks the proxy of a pod: "<name>.<namespace>", "<name>" (namespace default), or
// the full node id. None, or several on different replicas, is an error naming them.
func Find(proxies []Proxy, pod string) (Proxy, error) {
	name, ns, ok := strings.Cut(pod, ".")
	if !ok {
		ns = "default"
	}
	var found []Proxy
	for _, p := range proxies {
		if p.ProxyID == pod || (p.Name == name && p.Namespace == ns) {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		var names []string
		for _, p := range proxies {
			names = append(names, p.Pod())
		}
		return Proxy{}, fmt.Errorf("no proxy of pod %q is connected to discovery (connected: %s)", pod, orNone(names))
	case 1:
		return found[0], nil
	}
	var where []string
	for _, p := range found {
		where = append(where, p.ProxyID+" on "+p.Replica())
	}
	return found[0], fmt.Errorf("pod %q has %d connections: %s", pod, len(found), strings.Join(where, ", "))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
