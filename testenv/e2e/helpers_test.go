package e2e

import (
	"context"
	"io"
	"net/http"
	"time"
)

func nilCtx() context.Context { return context.Background() }

func getURL(url string) ([]byte, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
