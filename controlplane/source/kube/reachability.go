package kube

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
)

// reachability watches every request to the API server, to say when it is lost and when
// it is back: informers retry a refused connection without reporting it.
type reachability struct {
	next http.RoundTripper
	log  *slog.Logger
	host string
	lost *atomic.Bool // shared by every client of the source
}

func (r *reachability) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	switch {
	case err != nil && !errors.Is(err, context.Canceled) && req.Context().Err() == nil:
		if !r.lost.Swap(true) {
			r.log.Warn("lost the Kubernetes API server; the informers retry", "server", r.host, "error", err)
		}
	case err == nil && r.lost.Swap(false):
		r.log.Info("Kubernetes API server reachable again", "server", r.host)
	}
	return resp, err
}

// watchReachability wraps the clients' transport with a reachability observer.
func watchReachability(log *slog.Logger, host string) func(http.RoundTripper) http.RoundTripper {
	lost := &atomic.Bool{}
	return func(rt http.RoundTripper) http.RoundTripper {
		return &reachability{next: rt, log: log, host: host, lost: lost}
	}
}
