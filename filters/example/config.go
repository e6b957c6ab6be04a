package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/wasmesh/wasmesh/filters/internal/jsonconf"
)

// defaultCounter is the metric name used when the configuration names none.
const defaultCounter = "wasmesh_example_requests_total"

// config is the plugin configuration, JSON:
//
//	{
//	  "response_header": {"name": "x-wasmesh-example", "value": "hello"},
//	  "deny_path_prefix": "/admin",
//	  "counter": "wasmesh_example_requests_total"
//	}
//
// Every field is optional. Unknown fields are an error, so a typo fails the plugin at
// configure time instead of being silently ignored.
type config struct {
	// ResponseHeader is set on every response (replacing an upstream value of the same
	// name), local 403s included.
	ResponseHeader *header `json:"response_header"`
	// DenyPathPrefix answers 403 to requests whose :path starts with it; empty denies
	// nothing.
	DenyPathPrefix string `json:"deny_path_prefix"`
	// Counter names the counter incremented for every request.
	Counter string `json:"counter"`
}

type header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// parseConfig decodes and validates the plugin configuration. An empty configuration is
// the defaults.
func parseConfig(data []byte) (config, error) {
	cfg := config{Counter: defaultCounter}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	if err := jsonconf.Unmarshal(data, &cfg); err != nil {
		return config{}, fmt.Errorf("plugin configuration: %w", err)
	}
	if cfg.Counter == "" {
		return config{}, errors.New(`plugin configuration: "counter" must not be empty`)
	}
	if h := cfg.ResponseHeader; h != nil {
		if h.Name == "" {
			return config{}, errors.New(`plugin configuration: "response_header.name" must not be empty`)
		}
		// HTTP/2 and Envoy require lower-case header names; refusing others here is
		// clearer than a header that silently never appears.
		if h.Name != strings.ToLower(h.Name) || strings.ContainsAny(h.Name, " :\r\n\t") {
			return config{}, fmt.Errorf(`plugin configuration: "response_header.name" %q must be a lower-case header name`, h.Name)
		}
	}
	return cfg, nil
}

// denied reports whether a request for path is answered with 403.
func (c config) denied(path string) bool {
	return c.DenyPathPrefix != "" && strings.HasPrefix(path, c.DenyPathPrefix)
}

// responseHeaders returns the headers added to every response.
func (c config) responseHeaders() [][2]string {
	if c.ResponseHeader == nil {
		return nil
	}
	return [][2]string{{c.ResponseHeader.Name, c.ResponseHeader.Value}}
}

// denyResponse returns the headers and body of the local 403.
func (c config) denyResponse() (headers [][2]string, body []byte) {
	headers = append([][2]string{{"content-type", "text/plain; charset=utf-8"}}, c.responseHeaders()...)
	return headers, []byte("forbidden by wasmesh example filter\n")
}
