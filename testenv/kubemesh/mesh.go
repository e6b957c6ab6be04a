// Package kubemesh runs the local mesh on a real Kubernetes control plane, as `make run-k8s`
// does: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
// (controlplane/kubecluster), one node that runs pods as processes of this machine
// (testenv/kubenode), discovery installed from its own manifests (controlplane/deploy: two
// replicas electing a leader), a minimal kube-proxy for the istiod Service (ServiceProxy)
// that the sidecars reach discovery through, and the sample application as Deployments and
// Services with sidecars, its Istio config applied with kubectl. The pods' IPs must be
// local addresses outside 127/8 (the API server refuses loopback addresses in
// EndpointSlices): run in the network namespace RunInNetns makes.
package kubemesh

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

// Options configure a mesh.
type Options struct {
	// BinDir holds discovery, agent, meshproxy and echo (default $WASMESH_BIN_DIR);
	// WasmDir the filters (default $WASMESH_WASM_DIR); KubeBinDir the Kubernetes binaries
	// (default $WASMESH_KUBE_BIN_DIR).
	BinDir, WasmDir, KubeBinDir string
	// Dir holds the cluster, the node's pods and the rendered manifests; default a new
	// temporary directory, removed by Close.
	Dir string
	// SampleDir is the sample config (default testenv/samples/bookinfo of this checkout).
	SampleDir string
	// PodNet is the node's pod network (default PodNet), local to this machine.
	PodNet string
	// LeaseDuration is discovery's --leaseDuration (default: the manifests', 30 s).
	LeaseDuration time.Duration
	// Logf reports progress (default: silent); the node's own log lines go there too.
	Logf func(format string, args ...any)
}

// Mesh is a running mesh on Kubernetes.
type Mesh struct {
	opts    Options
	dir     string
	ownDir  bool
	kubectl string
	Cluster *kubecluster.Cluster
	Node    *kubenode.Node
	// XDS is the service proxy of istiod's TLS port (https-dns, 15012: xDS and the CA), the
	// sidecars' discovery address and CA address: the sidecars' TLS and tokens go through it
	// to a replica as they are.
	XDS *ServiceProxy
}

// Start starts the control plane and the node, installs discovery and waits until both its
// replicas are ready and reachable through the service proxy.
func Start(ctx context.Context, opts Options) (*Mesh, error) {
	m := &Mesh{opts: opts}
	if err := m.setDefaults(); err != nil {
		return nil, err
	}
	if err := m.start(ctx); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Mesh) setDefaults() error {
	o := &m.opts
	for _, d := range []struct {
		p   *string
		env string
	}{{&o.BinDir, "WASMESH_BIN_DIR"}, {&o.WasmDir, "WASMESH_WASM_DIR"}, {&o.KubeBinDir, kubecluster.EnvBinDir}} {
		if *d.p == "" {
			*d.p = os.Getenv(d.env)
		}
	}
	if o.KubeBinDir == "" {
		dir, err := kubecluster.BinDir()
		if err != nil {
			return err
		}
		o.KubeBinDir = dir
	}
	if o.BinDir == "" {
		return errors.New("kubemesh: no binary directory: set WASMESH_BIN_DIR or run `make build`")
	}
	for _, b := range []string{"discovery", "agent", "meshproxy", "echo"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("kubemesh: %s is missing in %s (run `make build`): %w", b, o.BinDir, err)
		}
	}
	if o.SampleDir == "" {
		_, file, _, _ := runtime.Caller(0)
		o.SampleDir = filepath.Join(filepath.Dir(file), "..", "samples", "bookinfo")
	}
	if o.PodNet == "" {
		o.PodNet = PodNet
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	m.kubectl = filepath.Join(o.KubeBinDir, "kubectl")
	return nil
}

func (m *Mesh) start(ctx context.Context) error {
	m.dir = m.opts.Dir
	if m.dir == "" {
		d, err := os.MkdirTemp("", "kubemesh-")
		if err != nil {
			return err
		}
		m.dir, m.ownDir = d, true
	}
	begin := time.Now()
	var err error
	// Aggregator routing: the API server calls webhooks of a Service at an endpoint's pod IP
	// (there is no kube-proxy for its ClusterIP).
	m.Cluster, err = kubecluster.Start(ctx, kubecluster.Options{Dir: filepath.Join(m.dir, "cluster"), BinDir: m.opts.KubeBinDir,
		ControllerManager: true, Scheduler: true, APIServerArgs: []string{"--enable-aggregator-routing=true"}})
	if err != nil {
		return err
	}
	m.opts.Logf("control plane up in %v: %s (kubeconfig %s)", time.Since(begin).Round(time.Millisecond), m.Cluster.Server(), m.Cluster.Kubeconfig)
	m.Node, err = kubenode.Start(ctx, kubenode.Options{Config: m.Cluster.Config, BinDir: m.opts.BinDir, Dir: filepath.Join(m.dir, "node"),
		PodNet: m.opts.PodNet, RestartBackoff: time.Second, MaxRestartBackoff: 10 * time.Second, Logf: m.opts.Logf})
	if err != nil {
		return err
	}
	// The service proxy first: its address is the sidecars' discovery address in the mesh
	// config installed next.
	m.XDS, err = StartServiceProxy(ctx, m.Cluster.Client, DiscoveryNamespace, DiscoveryService, "https-dns", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if err := m.installDiscovery(ctx); err != nil {
		return err
	}
	if err := m.waitDiscovery(ctx); err != nil {
		return err
	}
	m.opts.Logf("discovery's replicas ready %v after start; the sidecars reach them at %s", time.Since(begin).Round(time.Millisecond), m.XDS.Addr())
	return nil
}

// Dir is the mesh's directory: cluster/ (its logs, kubeconfig), node/pods/<pod>/logs/,
// deploy/ (the manifests applied), sample-config/.
func (m *Mesh) Dir() string { return m.dir }

// Close stops the node (every pod's processes), the service proxy and the control plane,
// and removes the directory Start made (unless WASMESH_KEEP_MESH_DIR is set).
func (m *Mesh) Close() {
	if m.Node != nil {
		m.Node.Close()
	}
	if m.XDS != nil {
		m.XDS.Close()
	}
	if m.Cluster != nil {
		m.Cluster.Stop()
	}
	if m.ownDir && os.Getenv("WASMESH_KEEP_MESH_DIR") == "" {
		_ = os.RemoveAll(m.dir)
	}
}

// KubectlPath is the cluster's kubectl.
func (m *Mesh) KubectlPath() string { return m.kubectl }

// Kubectl runs the cluster's kubectl as its admin and returns its output.
func (m *Mesh) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, m.kubectl, append([]string{"--kubeconfig", m.Cluster.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// pods are the pods of a namespace with the labels, sorted by name.
func (m *Mesh) pods(ctx context.Context, ns string, sel labels.Set) ([]corev1.Pod, error) {
	list, err := m.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podProblems says, for an error message, which pods of the namespace are not ready and
// why (their containers' waiting or terminated reasons).
func (m *Mesh) podProblems(ctx context.Context, ns string) string {
	pods, err := m.pods(ctx, ns, nil)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range pods {
		if podReady(&p) {
			continue
		}
		fmt.Fprintf(&b, "\n  pod %s/%s %s:", ns, p.Name, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case c.State.Waiting != nil:
				fmt.Fprintf(&b, " %s waiting (%s: %s);", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
			case c.State.Terminated != nil:
				fmt.Fprintf(&b, " %s terminated (%s, exit %d);", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			case !c.Ready:
				fmt.Fprintf(&b, " %s not ready (restarts %d);", c.Name, c.RestartCount)
			}
		}
	}
	return b.String()
}

// waitFor checks cond until it returns nil, timeout passes or ctx ends; the error names
// what was awaited, cond's last error and the pods of the namespaces ns that are not ready.
func (m *Mesh) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() error, ns ...string) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			var problems string
			for _, n := range ns {
				pctx, pcancel := context.WithTimeout(context.WithoutCancel(parent), 5*time.Second)
				problems += m.podProblems(pctx, n)
				pcancel()
			}
			return fmt.Errorf("kubemesh: waiting for %s: %w (last: %v)%s", what, ctx.Err(), err, problems)
		case <-tick.C:
		}
	}
}
