// Command ratelimit answers Envoy's rate-limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from YAML files in the
// format of Envoy's reference rate-limit service, counting in Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redisstore"
	"github.com/wasmesh/wasmesh/controlplane/ratelimit/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}

type flags struct {
	grpcAddr, metricsAddr, configDir string
	redis                            redisstore.Options
	timeout                          time.Duration
	nearLimitRatio                   float64
	noLocalCache                     bool
}

func parse(args []string, out io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "gRPC listen address of ShouldRateLimit")
	fs.StringVar(&f.metricsAddr, "metrics-addr", ":6070", "HTTP listen address of /metrics (Prometheus) and /healthz; empty for none")
	fs.StringVar(&f.configDir, "config-dir", "", "directory of rate-limit YAML files (Envoy ratelimit's format), watched for changes")
	fs.StringVar(&f.redis.Addrs, "redis-addr", "127.0.0.1:6379", "Redis host:port; several for Cluster; master@host:port,... for Sentinels")
	fs.StringVar(&f.redis.MasterName, "redis-sentinel-master", "", "Sentinel master name (then -redis-addr lists the Sentinels)")
	fs.BoolVar(&f.redis.Cluster, "redis-cluster", false, "-redis-addr are Redis Cluster nodes (implied by several addresses without a master)")
	fs.IntVar(&f.redis.PoolSize, "redis-pool-size", 0, "Redis connections per node (go-redis's default when 0)")
	fs.DurationVar(&f.timeout, "timeout", 100*time.Millisecond, "bound on a decision's Redis round trip; past it the domain's failure policy answers")
	fs.Float64Var(&f.nearLimitRatio, "near-limit-ratio", 0.8, "share of a limit past which hits count as near_limit")
	fs.BoolVar(&f.noLocalCache, "no-local-cache", false, "send hits on keys known over the limit to Redis too")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.configDir == "" {
		return nil, errors.New("-config-dir is required")
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("-timeout %v: want a positive duration", f.timeout)
	}
	if f.nearLimitRatio <= 0 || f.nearLimitRatio > 1 {
		return nil, fmt.Errorf("-near-limit-ratio %v: want a number in (0, 1]", f.nearLimitRatio)
	}
	f.redis.Timeout = f.timeout
	return f, nil
}

// run serves until ctx ends. ready, when not nil, gets the bound gRPC and metrics addresses.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(grpcAddr, metricsAddr string)) error {
	f, err := parse(args, logOut)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))
	redis.SetLogger(redisLog{log})
	store, err := redisstore.New(f.redis)
	if err != nil {
		return err
	}
	defer store.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc := service.New(store, service.NewMetrics(reg), service.Options{
		Timeout: f.timeout, NearLimitRatio: f.nearLimitRatio, NoLocalCache: f.noLocalCache, Log: log,
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	firstLoad := make(chan error, 1)
	watchDone := make(chan error, 1)
	go func() { watchDone <- svc.WatchConfig(ctx, f.configDir, func(err error) { firstLoad <- err }) }()
	select {
	case err := <-watchDone:
		return err
	case err := <-firstLoad:
		if err != nil { // nothing good to keep at start: refuse to serve
			return err
		}
	}
	lis, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	rlv3.RegisterRateLimitServiceServer(gs, svc)
	var hs *http.Server
	metricsAddr := ""
	if f.metricsAddr != "" {
		hl, err := net.Listen("tcp", f.metricsAddr)
		if err != nil {
			lis.Close()
			return err
		}
		metricsAddr = hl.Addr().String()
		hs = &http.Server{Handler: httpHandler(reg, svc), ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(hl)
	}
	log.Info("rate-limit service serving", "grpc", lis.Addr().String(), "metrics", metricsAddr, "redis", f.redis.Addrs)
	if ready != nil {
		ready(lis.Addr().String(), metricsAddr)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	select {
	case err = <-served:
	case err = <-watchDone:
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		gs.Stop()
	}
	if hs != nil {
		hs.Close()
	}
	return err
}

// redisLog puts go-redis's own messages (a failed dial) in the service's log.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "go-redis: "+strings.TrimSpace(fmt.Sprintf(format, v...)))
}

func httpHandler(reg *prometheus.Registry, svc *service.Service) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := svc.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := svc.LoadError(); err != nil { // still serving the last good config
			fmt.Fprintf(w, "ok; the last config change was rejected: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
