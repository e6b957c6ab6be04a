package localmesh

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The mesh's rate-limit service (Options.RateLimitConfig): a redis-server and bin/ratelimit
// (Envoy's RateLimitService API, counting in that Redis) on loopback beside discovery, and a
// ServiceEntry that makes it a mesh service, as Istio's rate-limit task deploys Envoy's
// reference service in the cluster: host RateLimitHost, port 8081 named grpc with protocol
// GRPC (so discovery gives its cluster HTTP/2, as Istio does for gRPC ports), resolution
// STATIC with the service's loopback address as the one endpoint. Every sidecar then has
// the cluster RateLimitCluster, which the quota filter's global mode names. The endpoint
// has no tlsMode label (the service runs without a sidecar), so auto mTLS leaves the
// connection plaintext, as Istio does for a workload outside the mesh.
const (
	RateLimitHost    = "ratelimit.default.svc.cluster.local"
	RateLimitPort    = 8081
	RateLimitCluster = "outbound|8081||" + RateLimitHost
	// RateLimitServiceFile is the config file (in the mesh's config directory) holding the
	// ServiceEntry.
	RateLimitServiceFile = "ratelimit-service.yaml"
	// rateLimitConfigFile is the service's configuration file in its watched directory.
	rateLimitConfigFile = "config.yaml"
)

// RateLimit is the mesh's running rate-limit service and its Redis.
type RateLimit struct {
	dir         string
	redisPort   int
	grpcAddr    string
	metricsAddr string
	redis       *Process
	service     *Process
}

// RedisAddr is the Redis the service counts in.
func (r *RateLimit) RedisAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.redisPort))
}

// GRPCAddr is the service's ShouldRateLimit address (the ServiceEntry's endpoint).
func (r *RateLimit) GRPCAddr() string { return r.grpcAddr }

// MetricsURL is the URL of path on the service's HTTP server (/metrics, /healthz).
func (r *RateLimit) MetricsURL(path string) string { return "http://" + r.metricsAddr + path }

// ConfigDir is the directory of Envoy ratelimit YAML files the service watches.
func (r *RateLimit) ConfigDir() string { return filepath.Join(r.dir, "config") }

// ConfigFile is the service's configuration file, Options.RateLimitConfig at start.
func (r *RateLimit) ConfigFile() string { return filepath.Join(r.ConfigDir(), rateLimitConfigFile) }

// ServiceLog and RedisLog are the processes' logs.
func (r *RateLimit) ServiceLog() string { return r.service.LogPath }
func (r *RateLimit) RedisLog() string   { return r.redis.LogPath }

// Running reports whether the rate-limit service runs.
func (r *RateLimit) Running() bool { return r.service != nil && r.service.Running() }

// RedisRunning reports whether Redis runs (KillRedis stops it, StartRedis again).
func (r *RateLimit) RedisRunning() bool { return r.redis != nil && r.redis.Running() }

// RateLimit is the mesh's rate-limit service, nil without Options.RateLimitConfig.
func (m *Mesh) RateLimit() *RateLimit {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rateLimit
}

// startRateLimit runs Redis and the rate-limit service with Options.RateLimitConfig and
// writes the ServiceEntry into the config directory (before discovery reads it).
func (m *Mesh) startRateLimit(ctx context.Context) error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("localmesh: the rate-limit service needs redis-server on PATH (`make tools` installs Debian's): %w", err)
	}
	bin := filepath.Join(m.opts.BinDir, "ratelimit")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("localmesh: ratelimit is missing in %s (run `make build`): %w", m.opts.BinDir, err)
	}
	r := &RateLimit{dir: filepath.Join(m.opts.Dir, "ratelimit")}
	m.mu.Lock()
	m.rateLimit = r
	m.mu.Unlock()
	if err := os.MkdirAll(r.ConfigDir(), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(r.ConfigFile(), []byte(m.opts.RateLimitConfig), 0o644); err != nil {
		return err
	}
	if err := m.startRedisOnFreePort(ctx, r); err != nil {
		return err
	}
	if err := m.startRateLimitService(ctx, r, bin); err != nil {
		return err
	}
	m.opts.Logf("rate-limit service ready: gRPC on %s (%s), metrics on %s, Redis on %s",
		r.grpcAddr, RateLimitCluster, r.MetricsURL("/metrics"), r.RedisAddr())
	return m.WriteConfig(RateLimitServiceFile, rateLimitServiceEntry(r.grpcAddr))
}

// rateLimitServiceEntry is the ServiceEntry of the service listening at addr.
func rateLimitServiceEntry(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf(`# Written by the local mesh: the rate-limit service (bin/ratelimit, counting in Redis) as a
# mesh service, so every sidecar has the cluster %s.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: ratelimit
  namespace: default
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: %d, name: grpc, protocol: GRPC}
  endpoints:
  - address: %s
    ports: {grpc: %s}
`, RateLimitCluster, RateLimitHost, RateLimitPort, host, port)
}

func (m *Mesh) startRedisOnFreePort(ctx context.Context, r *RateLimit) error {
	var err error
	for range 3 { // a free port may be taken before redis binds it
		if r.redisPort, err = pickPort("127.0.0.1"); err != nil {
			return err
		}
		if err = m.StartRedis(ctx); err == nil || !strings.Contains(err.Error(), "in use") {
			return err
		}
	}
	return err
}

// StartRedis starts the rate-limit service's Redis (again, after KillRedis, on the same
// port, empty: it keeps nothing on disk) and waits until it answers.
func (m *Mesh) StartRedis(ctx context.Context) error {
	r := m.RateLimit()
	if r == nil {
		return fmt.Errorf("localmesh: the mesh runs no rate-limit service (Options.RateLimitConfig)")
	}
	dir := filepath.Join(r.dir, "redis")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p, err := m.startProcess("redis", filepath.Join(m.opts.Dir, "logs"), "redis-server",
		[]string{"--port", strconv.Itoa(r.redisPort), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--loglevel", "warning"}, nil)
	if err != nil {
		return err
	}
	m.mu.Lock()
	r.redis = p
	m.mu.Unlock()
	return waitFor(ctx, p, "redis to answer", func() error { return redisPing(r.RedisAddr()) })
}

// KillRedis kills Redis at once (SIGKILL), as a crash: the service's decisions then follow
// each domain's failure policy until StartRedis.
func (m *Mesh) KillRedis() {
	if r := m.RateLimit(); r != nil && r.redis != nil {
		r.redis.Kill()
	}
}

// redisPing sends PING in RESP and wants +PONG.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	b := make([]byte, 7)
	n, err := c.Read(b)
	if err != nil {
		return err
	}
	if string(b[:n]) != "+PONG\r\n" {
		return fmt.Errorf("redis %s answered PING with %q", addr, b[:n])
	}
	return nil
}

func (m *Mesh) startRateLimitService(ctx context.Context, r *RateLimit, bin string) error {
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		grpcPort, perr := pickPort("127.0.0.1")
		if perr != nil {
			return perr
		}
		metricsPort, perr := pickPort("127.0.0.1")
		if perr != nil {
			return perr
		}
		r.grpcAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort))
		r.metricsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))
		var p *Process
		p, err = m.startProcess("ratelimit", filepath.Join(m.opts.Dir, "logs"), bin,
			[]string{"-grpc-addr", r.grpcAddr, "-metrics-addr", r.metricsAddr, "-config-dir", r.ConfigDir(),
				"-redis-addr", r.RedisAddr()}, nil)
		if err != nil {
			return err
		}
		m.mu.Lock()
		r.service = p
		m.mu.Unlock()
		err = waitFor(ctx, p, "the rate-limit service to be ready", func() error { return httpOK(r.MetricsURL("/healthz")) })
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
	}
	return err
}

// WriteRateLimitConfig replaces a file of the service's watched config directory
// atomically (name "config.yaml" is Options.RateLimitConfig's); the service reloads it,
// or rejects it by name and keeps the last good configuration.
func (m *Mesh) WriteRateLimitConfig(name, content string) error {
	r := m.RateLimit()
	if r == nil {
		return fmt.Errorf("localmesh: the mesh runs no rate-limit service (Options.RateLimitConfig)")
	}
	tmp := filepath.Join(r.ConfigDir(), "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.ConfigDir(), name))
}

// stopRateLimit stops the service, then Redis.
func (m *Mesh) stopRateLimit(ctx context.Context) {
	r := m.RateLimit()
	if r == nil {
		return
	}
	for _, p := range []*Process{r.service, r.redis} {
		if p != nil {
			_ = p.Stop(ctx)
		}
	}
}
