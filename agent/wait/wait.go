// Package wait implements `agent wait`: poll the pod's readiness URL until it answers
// 200 or the time is up, so a postStart hook starts the application only after the
// proxy is ready (holdApplicationUntilProxyStarts).
package wait

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// DefaultURL is the proxy's readiness listener on the pod's wildcard address.
func DefaultURL() string {
	host := os.Getenv("WASMESH_WILDCARD")
	if host == "" || host == "0.0.0.0" {
		host = "localhost"
	}
	return "http://" + host + ":15021/healthz/ready"
}

// Options of one wait.
type Options struct {
	URL            string
	Timeout        time.Duration
	RequestTimeout time.Duration
	Period         time.Duration
	Log            io.Writer
}

// Run returns nil once URL answers 200, or an error when Timeout passes first.
func Run(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	client := &http.Client{Timeout: o.RequestTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	t := time.NewTicker(o.Period)
	defer t.Stop()
	start := time.Now()
	last := "no answer yet"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
		if err != nil {
			return fmt.Errorf("--url %q: %w", o.URL, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Fprintf(o.Log, "proxy is ready after %v\n", time.Since(start).Round(time.Millisecond))
				return nil
			}
			last = resp.Status
		} else if ctx.Err() == nil {
			// An attempt cut short by the overall deadline says nothing new.
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("proxy not ready after %v (%s): last answer: %s", o.Timeout, o.URL, last)
		case <-t.C:
		}
	}
}
