package kubenode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// runHandler runs a lifecycle hook: exec inside the container, an HTTP GET (host: the pod
// IP unless set), a TCP connection, or a sleep.
func (c *container) runHandler(ctx context.Context, h *corev1.LifecycleHandler, x *execContext) error {
	switch {
	case h.Exec != nil:
		return c.execAction(ctx, h.Exec.Command, x)
	case h.HTTPGet != nil:
		return c.httpGet(ctx, h.HTTPGet)
	case h.TCPSocket != nil:
		return c.tcpDial(ctx, h.TCPSocket)
	case h.Sleep != nil:
		t := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.New("a handler of no kind the node knows")
}

// execAction runs an exec hook or probe: it fails unless the command exits 0.
func (c *container) execAction(ctx context.Context, argv []string, x *execContext) error {
	out, err := c.execIn(ctx, argv, x)
	if err != nil {
		return fmt.Errorf("command %q exited with %v: %s", strings.Join(argv, " "), err, out)
	}
	return nil
}

// execIn runs argv inside the container: its environment and working directory, mount
// paths rewritten, the program resolved as the container's own command is.
func (c *container) execIn(ctx context.Context, argv []string, x *execContext) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("no command")
	}
	argv = x.mounts.rewriteAll(argv)
	prog, err := c.pod.node.program(x.img, argv[0])
	if err != nil {
		return "", err
	}
	argv[0] = prog
	out, err := runExec(ctx, argv, x.env, x.dir)
	return strings.TrimSpace(string(out)), err
}

func (c *container) port(p intstr.IntOrString) (string, error) {
	if p.Type == intstr.Int {
		return strconv.Itoa(p.IntValue()), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return strconv.Itoa(int(cp.ContainerPort)), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return strconv.Itoa(n), nil
	}
	return "", fmt.Errorf("no container port named %q", p.StrVal)
}

func (c *container) host(h string) string {
	if h == "" {
		return c.pod.ip
	}
	return h
}

// probeClient does not follow redirects: a redirect is a success, as for the kubelet.
var probeClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true,
		Proxy: nil},
}

func (c *container) httpGet(ctx context.Context, g *corev1.HTTPGetAction) error {
	port, err := c.port(g.Port)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(c.host(g.Host), port)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String()+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

func (c *container) tcpDial(ctx context.Context, t *corev1.TCPSocketAction) error {
	port, err := c.port(t.Port)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(c.host(t.Host), port))
	if err != nil {
		return err
	}
	return conn.Close()
}

func (c *container) grpcCheck(ctx context.Context, g *corev1.GRPCAction) error {
	conn, err := grpc.NewClient(net.JoinHostPort(c.pod.ip, strconv.Itoa(int(g.Port))),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var service string
	if g.Service != nil {
		service = *g.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service unhealthy (responded with %q)", resp.Status)
	}
	return nil
}

// probeOnce runs a probe's handler once, bounded by its timeout.
func (c *container) probeOnce(ctx context.Context, p *corev1.Probe, x *execContext) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.Exec != nil:
		return c.execAction(ctx, p.Exec.Command, x)
	case p.HTTPGet != nil:
		return c.httpGet(ctx, p.HTTPGet)
	case p.TCPSocket != nil:
		return c.tcpDial(ctx, p.TCPSocket)
	case p.GRPC != nil:
		return c.grpcCheck(ctx, p.GRPC)
	}
	return errors.New("a probe of no kind the node knows")
}

// probe runs the container's probes for one run, until the run ends: the startup probe
// first (the container is started once it passes; it is restarted when it fails), then
// liveness (restart on failure) and readiness (the container's ready status).
func (c *container) probe(proc *process, x *execContext) {
	ctx, cancel := context.WithCancel(c.pod.node.ctx)
	defer cancel()
	go func() {
		select {
		case <-proc.done:
		case <-c.stopCh:
		}
		cancel()
	}()
	r := c.pod
	if p := c.spec.StartupProbe; p != nil {
		passed := c.probeLoop(ctx, p, x, func(ok bool, msg string) bool {
			if !ok {
				c.failedProbe(proc, p, "Startup", msg)
			}
			return false // decided either way
		})
		if !passed {
			return
		}
		r.mu.Lock()
		c.started = proc.running()
		c.ready = c.started && c.spec.ReadinessProbe == nil
		r.changedLocked()
		r.mu.Unlock()
	}
	if p := c.spec.LivenessProbe; p != nil {
		go c.probeLoop(ctx, p, x, func(ok bool, msg string) bool {
			if !ok {
				c.failedProbe(proc, p, "Liveness", msg)
				return false
			}
			return true
		})
	}
	if p := c.spec.ReadinessProbe; p != nil {
		c.probeLoop(ctx, p, x, func(ok bool, msg string) bool {
			r.mu.Lock()
			if c.ready != ok && proc.running() {
				c.ready = ok
				r.changedLocked()
			}
			r.mu.Unlock()
			if !ok {
				r.node.event(r, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: "+msg)
			}
			return true
		})
	}
	<-ctx.Done()
}

// probeLoop probes every period after the initial delay and calls result each time the
// success or failure threshold is reached, until result returns false or ctx ends. It
// reports whether the last result was a success.
func (c *container) probeLoop(ctx context.Context, p *corev1.Probe, x *execContext, result func(ok bool, msg string) bool) bool {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	if p.PeriodSeconds == 0 {
		period = 10 * time.Second
	}
	successes, failures := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 1)
	if p.FailureThreshold == 0 {
		failures = 3
	}
	t := time.NewTimer(time.Duration(p.InitialDelaySeconds) * time.Second)
	defer t.Stop()
	var okRun, failRun int32
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		err := c.probeOnce(ctx, p, x)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
		} else {
			okRun, failRun = 0, failRun+1
		}
		switch {
		case okRun == successes:
			if !result(true, "") {
				return true
			}
		case failRun == failures:
			if !result(false, err.Error()) {
				return false
			}
		}
		t.Reset(period)
	}
}

// failedProbe restarts the run whose startup or liveness probe failed, as the kubelet
// does: the run is killed (preStop hook, SIGTERM, SIGKILL after the probe's or the pod's
// grace period) and the restart policy decides.
func (c *container) failedProbe(proc *process, p *corev1.Probe, kind, msg string) {
	r := c.pod
	r.node.event(r, corev1.EventTypeWarning, "Unhealthy", kind+" probe failed: "+msg)
	grace := r.gracePeriod(nil)
	if p.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	go c.terminateRun(proc, time.Now().Add(grace),
		fmt.Sprintf("Container %s failed %s probe, will be restarted", c.spec.Name, strings.ToLower(kind)))
}
