// Package httpget GETs a URL for the test environment's clients of debug, admin, metrics
// and Prometheus API pages.
package httpget

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// Get returns the body of url. A status other than 200 is an error, returned with the body
// (APIs explain their errors there).
func Get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}
