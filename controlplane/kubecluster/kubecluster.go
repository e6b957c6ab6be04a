// Package kubecluster runs a real Kubernetes control plane on loopback: etcd,
// kube-apiserver and, when asked, kube-controller-manager and kube-scheduler, from the
// binaries `make kube-bin` builds from Go modules (testenv/kubebin). The tests of the
// Kubernetes source and webhooks run against it, and so does the local mesh on Kubernetes.
//
// Everything lives in one directory: a CA and the certificates it signs (the API server's
// serving certificate, an admin client certificate in system:masters), the service-account
// signing key, an admin kubeconfig, etcd's data and every process's log.
package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// EnvBinDir names the directory holding the binaries (the Makefile exports it).
const EnvBinDir = "WASMESH_KUBE_BIN_DIR"

// Binaries the control plane needs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// BinDir returns the directory of the binaries, or an error saying how to build them.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: run the tests through `make test`, or `make kube-bin` and set it to the directory it prints", EnvBinDir)
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s in %s=%s: %w (run `make kube-bin`)", b, EnvBinDir, dir, err)
		}
	}
	return dir, nil
}

// Options choose what runs besides etcd and the API server.
type Options struct {
	// Dir holds the cluster's files; default a new temporary directory, removed by Stop.
	Dir string
	// BinDir holds the binaries; default BinDir().
	BinDir string
	// ControllerManager runs kube-controller-manager (ReplicaSets, EndpointSlices, service
	// accounts and their tokens, namespace deletion, ...).
	ControllerManager bool
	// Scheduler runs kube-scheduler (pods are bound to nodes).
	Scheduler bool
	// APIServerArgs are added to kube-apiserver's command line.
	APIServerArgs []string
}

// Cluster is a running control plane.
type Cluster struct {
	opts   Options
	ownDir bool
	// Kubeconfig is the admin kubeconfig file (system:masters).
	Kubeconfig string
	// Config is the admin client configuration; Client a clientset on it.
	Config *rest.Config
	Client kubernetes.Interface
	// ServiceAccountKey is the key the API server signs service-account tokens with (PEM).
	ServiceAccountKey string

	pki     *pki
	etcdURL string
	apiPort int
	mu      sync.Mutex
	procs   map[string]*process
}

// Start starts etcd and the API server (and what opts asks for) and waits until the API
// server is ready.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.BinDir == "" {
		dir, err := BinDir()
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	}
	c := &Cluster{opts: opts, procs: map[string]*process{}}
	if c.opts.Dir == "" {
		d, err := os.MkdirTemp("", "kubecluster-")
		if err != nil {
			return nil, err
		}
		c.opts.Dir, c.ownDir = d, true
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	var err error
	if c.pki, err = newPKI(filepath.Join(c.opts.Dir, "pki")); err != nil {
		return err
	}
	c.ServiceAccountKey = c.pki.path("sa.key")
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	c.apiPort = ports[2]
	if err := c.startEtcd(ports[0], ports[1]); err != nil {
		return err
	}
	if err := c.writeKubeconfig(); err != nil {
		return err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return err
	}
	if c.opts.ControllerManager {
		if err := c.StartControllerManager(); err != nil {
			return err
		}
	}
	if c.opts.Scheduler {
		if err := c.startScheduler(); err != nil {
			return err
		}
	}
	return nil
}

// Server is the API server's URL.
func (c *Cluster) Server() string { return "https://127.0.0.1:" + strconv.Itoa(c.apiPort) }

// CAFile is the cluster CA certificate (it signed the API server's serving certificate).
func (c *Cluster) CAFile() string { return c.pki.path("ca.crt") }

func (c *Cluster) startEtcd(client, peer int) error {
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	return c.run("etcd", "etcd",
		"--name", "default",
		"--data-dir", filepath.Join(c.opts.Dir, "etcd"),
		"--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn")
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) and waits until it is
// ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	args := []string{
		"--etcd-servers", c.etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(c.apiPort),
		"--tls-cert-file", c.pki.path("apiserver.crt"), "--tls-private-key-file", c.pki.path("apiserver.key"),
		"--client-ca-file", c.pki.path("ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", c.pki.path("sa.pub"),
		"--service-account-signing-key-file", c.pki.path("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--endpoint-reconciler-type", "none",
		"--authorization-mode", "Node,RBAC",
		"--allow-privileged",
	}
	if err := c.run("kube-apiserver", "kube-apiserver", append(args, c.opts.APIServerArgs...)...); err != nil {
		return err
	}
	if err := c.connect(); err != nil {
		return err
	}
	return c.waitReady(ctx)
}

// StopAPIServer stops kube-apiserver (clients see it gone, as in an API server restart).
func (c *Cluster) StopAPIServer() { c.stop("kube-apiserver") }

// StartControllerManager starts kube-controller-manager with its default controllers,
// each using a service account of its own as in a real cluster.
func (c *Cluster) StartControllerManager() error {
	return c.run("kube-controller-manager", "kube-controller-manager",
		"--kubeconfig", c.Kubeconfig,
		"--leader-elect=false",
		"--use-service-account-credentials",
		"--service-account-private-key-file", c.pki.path("sa.key"),
		"--root-ca-file", c.pki.path("ca.crt"),
		"--cluster-signing-cert-file", c.pki.path("ca.crt"), "--cluster-signing-key-file", c.pki.path("ca.key"),
		"--bind-address", "127.0.0.1", "--secure-port", "0",
		"--controllers", "*")
}

func (c *Cluster) startScheduler() error {
	return c.run("kube-scheduler", "kube-scheduler",
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "0")
}

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c.Config, c.Client = cfg, client
	return nil
}

// waitReady polls /readyz until the API server answers ok or ctx ends.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		if p := c.proc("kube-apiserver"); p != nil && p.exited() {
			return fmt.Errorf("kube-apiserver exited: %v\n%s", p.err, p.tail(3000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %v (last: %v)\n%s", ctx.Err(), last, c.proc("kube-apiserver").tail(3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops every process and removes the directory if Start made it.
func (c *Cluster) Stop() {
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		c.stop(name)
	}
	if c.ownDir && os.Getenv("WASMESH_KEEP_KUBE_DIR") == "" {
		_ = os.RemoveAll(c.opts.Dir)
	}
}

// LogTail returns the end of a process's log, for a test's failure message.
func (c *Cluster) LogTail(name string, n int64) string {
	if p := c.proc(name); p != nil {
		return p.tail(n)
	}
	return ""
}

func (c *Cluster) proc(name string) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

func (c *Cluster) run(name, bin string, args ...string) error {
	p, err := startProcess(filepath.Join(c.opts.BinDir, bin), filepath.Join(c.opts.Dir, "logs", name+".log"), args)
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return nil
}

func (c *Cluster) stop(name string) {
	c.mu.Lock()
	p := c.procs[name]
	delete(c.procs, name)
	c.mu.Unlock()
	if p != nil {
		p.stop(10 * time.Second)
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("no free port"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
