// Package kubenode is a Kubernetes node for the local mesh: it registers a Node with a
// real API server, takes the pods bound to it and runs each container's command as a
// local process, with the pod's environment, volumes and loopback addresses, runs its
// hooks and probes and reports pod status, so that the real controllers (ReplicaSet,
// EndpointSlice) and the sidecar injector do the rest. virtual-kubelet's node package does
// the kubelet's API side (the Node, its lease and heartbeats, the pod informer, status
// sync); this package is its provider: the container runtime. See README.md.
package kubenode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// Options configure a node.
type Options struct {
	// Config reaches the API server with rights to register the node, update pods' status,
	// read ConfigMaps and Secrets and request service-account tokens (the admin
	// configuration of a test cluster). Required.
	Config *rest.Config
	// Name is the Node's name; default "kubenode-<Net>".
	Name string
	// BinDir holds the binaries the image table names; default $WASMESH_BIN_DIR.
	BinDir string
	// Images are added to DefaultImages (an entry of the same name replaces it).
	Images map[string]Image
	// Dir holds the pods' directories (volumes, logs); default a new temporary directory,
	// removed by Close.
	Dir string
	// Net is the second octet of the pods' IPs (127.<Net>.x.y); their private localhost
	// addresses are 127.<Net+10>.x.y and the node's own address 127.<Net>.255.254. It must
	// be one of 200-209 (the local mesh's blocks are 30-89 and 130-189). Default: a block
	// no other running node holds, claimed for the node's lifetime.
	Net int
	// PodNet, when set ("a.b"), puts the pods' IPs in a.b.x.y instead of 127.<Net>.x.y (their
	// localhost addresses stay 127.<Net+10>.x.y). The API server refuses loopback addresses
	// in EndpointSlices, so pods behind a Service need IPs outside 127/8 that are local to
	// this machine, e.g. 198.18.0.0/15 made local with `ip route add local 198.18.0.0/15 dev
	// lo` (in a network namespace of the caller's: see the package's tests).
	PodNet string
	// RestartBackoff and MaxRestartBackoff bound the back-off between a crashed container's
	// restarts (and image or configuration retries): the kubelet's 10 s and 5 min by
	// default.
	RestartBackoff, MaxRestartBackoff time.Duration
	// VolumeSyncPeriod is how often ConfigMap, Secret, downward-API and token files are
	// brought up to date (default 1 min, the kubelet's sync period).
	VolumeSyncPeriod time.Duration
	// Logf receives the node's own log lines (default: discarded).
	Logf func(format string, args ...any)
}

// Node is a running node.
type Node struct {
	opts        Options
	ctx         context.Context
	cancel      context.CancelFunc
	client      kubernetes.Interface
	restConfig  *rest.Config
	images      map[string]Image
	dir         string
	ownDir      bool
	net         int
	podNet      string
	claim       net.Listener
	hostIP      string
	kubeletAPI  *http.Server
	kubeletPort int32
	allocatable corev1.ResourceList
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	controllers sync.WaitGroup

	closeOnce sync.Once

	mu     sync.Mutex
	pods   map[string]*podRun
	all    []*podRun
	seq    int
	notify func(*corev1.Pod)
}

const (
	firstNet        = 200
	netBlocks       = 10
	localhostOffset = 10
)

// netClaimPort is where a node holds a listener on 127.<Net>.255.254 (its own address) for
// as long as it runs, so that nodes running side by side never share a block; the local
// mesh claims its blocks the same way.
var netClaimPort = 15999

// Start registers the node and runs it until Close. It returns once the Node is
// registered and the pod controller is running.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if opts.Config == nil {
		return nil, errors.New("kubenode: Options.Config is required")
	}
	n := &Node{opts: opts, restConfig: opts.Config, pods: map[string]*podRun{}, images: DefaultImages()}
	n.setDefaults()
	for k, v := range opts.Images {
		n.images[k] = v
	}
	if err := n.claimNet(opts.Net); err != nil {
		return nil, err
	}
	n.hostIP = fmt.Sprintf("127.%d.255.254", n.net)
	if n.podNet = opts.PodNet; n.podNet == "" {
		n.podNet = fmt.Sprintf("127.%d", n.net)
	} else if ip := net.ParseIP(n.podNet + ".0.1"); ip == nil || ip.To4() == nil {
		n.claim.Close()
		return nil, fmt.Errorf("kubenode: PodNet %q is not the first two octets of an IPv4 address", n.podNet)
	}
	if n.opts.Name == "" {
		n.opts.Name = "kubenode-" + strconv.Itoa(n.net)
	}
	if n.dir = opts.Dir; n.dir == "" {
		d, err := os.MkdirTemp("", "kubenode-")
		if err != nil {
			n.claim.Close()
			return nil, err
		}
		n.dir, n.ownDir = d, true
	}
	client, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	n.client = client
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.broadcaster = record.NewBroadcaster(record.WithContext(n.ctx))
	n.broadcaster.StartRecordingToSink(&corev1client.EventSinkImpl{Interface: client.CoreV1().Events("")})
	n.recorder = n.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: n.opts.Name})
	if err := n.startKubeletAPI(); err != nil {
		n.Close()
		return nil, err
	}
	if err := n.startControllers(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) setDefaults() {
	if n.opts.BinDir == "" {
		n.opts.BinDir = os.Getenv("WASMESH_BIN_DIR")
	}
	if n.opts.RestartBackoff <= 0 {
		n.opts.RestartBackoff = 10 * time.Second
	}
	if n.opts.MaxRestartBackoff <= 0 {
		n.opts.MaxRestartBackoff = 5 * time.Minute
	}
	if n.opts.VolumeSyncPeriod <= 0 {
		n.opts.VolumeSyncPeriod = time.Minute
	}
}

// claimNet takes the pod address block want (any free one when 0).
func (n *Node) claimNet(want int) error {
	if want != 0 && (want < firstNet || want >= firstNet+netBlocks) {
		return fmt.Errorf("kubenode: Net %d is outside 127.%d-%d.x.x", want, firstNet, firstNet+netBlocks-1)
	}
	var err error
	first := rand.IntN(netBlocks)
	for i := range netBlocks {
		b := firstNet + (first+i)%netBlocks
		if want != 0 {
			b = want
		}
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.%d.255.254", b), strconv.Itoa(netClaimPort))); err == nil {
			n.net, n.claim = b, l
			return nil
		}
		if want != 0 {
			break
		}
	}
	return fmt.Errorf("kubenode: no free pod address block in 127.%d-%d.x.x: %w", firstNet, firstNet+netBlocks-1, err)
}

// startControllers runs virtual-kubelet's node controller (the Node, its status and
// lease) and pod controller (the pods bound to the node, through the provider).
func (n *Node) startControllers(ctx context.Context) error {
	nodeObj := n.nodeObject()
	nc, err := vknode.NewNodeController(vknode.NaiveNodeProvider{}, nodeObj, n.client.CoreV1().Nodes(),
		vknode.WithNodeEnableLeaseV1(n.client.CoordinationV1().Leases(corev1.NamespaceNodeLease), 0))
	if err != nil {
		return fmt.Errorf("kubenode: %w", err)
	}
	podInformers := informers.NewSharedInformerFactoryWithOptions(n.client, time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.opts.Name).String()
		}))
	others := informers.NewSharedInformerFactory(n.client, time.Minute)
	pc, err := vknode.NewPodController(vknode.PodControllerConfig{
		PodClient:         podsClient{PodsGetter: n.client.CoreV1(), n: n},
		PodInformer:       podInformers.Core().V1().Pods(),
		EventRecorder:     n.recorder,
		Provider:          provider{n},
		ConfigMapInformer: others.Core().V1().ConfigMaps(),
		SecretInformer:    others.Core().V1().Secrets(),
		ServiceInformer:   others.Core().V1().Services(),
		// The provider resolves the environment itself: it knows the pod IP.
		SkipDownwardAPIResolution: true,
	})
	if err != nil {
		return fmt.Errorf("kubenode: %w", err)
	}
	podInformers.Start(n.ctx.Done())
	others.Start(n.ctx.Done())
	n.controllers.Add(2)
	go func() {
		defer n.controllers.Done()
		_ = nc.Run(n.ctx)
	}()
	go func() {
		defer n.controllers.Done()
		_ = pc.Run(n.ctx, 4)
	}()
	for _, c := range []struct {
		what  string
		ready <-chan struct{}
		done  <-chan struct{}
		err   func() error
	}{{"node controller", nc.Ready(), nc.Done(), nc.Err}, {"pod controller", pc.Ready(), pc.Done(), pc.Err}} {
		select {
		case <-c.ready:
		case <-c.done:
			return fmt.Errorf("kubenode: %s: %v", c.what, c.err())
		case <-ctx.Done():
			return fmt.Errorf("kubenode: waiting for the %s: %w", c.what, ctx.Err())
		}
	}
	n.logf("node %s registered: pod IPs %s.x.y, localhost 127.%d.x.y, directory %s", n.opts.Name, n.podNet, n.net+localhostOffset, n.dir)
	return nil
}

// nodeObject is the Node as registered: Ready, this machine's CPUs and memory, 110 pods.
func (n *Node) nodeObject() *corev1.Node {
	n.allocatable = corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.opts.Name, Labels: map[string]string{
			corev1.LabelHostname: n.opts.Name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
			"type": "kubenode"}},
		Status: corev1.NodeStatus{
			Capacity:    n.allocatable.DeepCopy(),
			Allocatable: n.allocatable.DeepCopy(),
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubenode is posting ready status"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubenode has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubenode has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubenode has sufficient PID available"),
			},
			// No Hostname address: the API server, preferring it, could not resolve the
			// name to reach the kubelet API; it takes the InternalIP.
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.hostIP}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: n.kubeletPort}},
			NodeInfo: corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: runtime.GOARCH,
				KubeletVersion: "v1.37.2-kubenode", KubeProxyVersion: "", ContainerRuntimeVersion: "kubenode://1"},
		},
	}
}

// memTotal is the machine's memory in bytes (4 GiB when /proc/meminfo cannot be read).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			return kb * 1024
		}
	}
	return 4 << 30
}

// Name is the Node's name.
func (n *Node) Name() string { return n.opts.Name }

// HostIP is the node's address (the pods' status.hostIP).
func (n *Node) HostIP() string { return n.hostIP }

// Localhost is the private localhost (WASMESH_LOCALHOST) of the node's pod whose IP is
// podIP, where its containers listen for the pod alone (a sidecar's admin port, 15000);
// "" for an address outside the node's pod network.
func (n *Node) Localhost(podIP string) string {
	rest, ok := strings.CutPrefix(podIP, n.podNet+".")
	if xy := strings.Split(rest, "."); ok && len(xy) == 2 && net.ParseIP(podIP) != nil {
		return fmt.Sprintf("127.%d.%s.%s", n.net+localhostOffset, xy[0], xy[1])
	}
	return ""
}

// Dir is the node's directory: pods/<namespace>_<name>_<uid>/ holds each pod's volumes/
// and logs/<container>/<run>.log.
func (n *Node) Dir() string { return n.dir }

// Processes lists the processes the node started that are still there (containers,
// hooks, probes and what they started): every one carries EnvNodeDir=Dir().
func (n *Node) Processes() []int { return processesMarked(EnvNodeDir, n.dir) }

// Close stops the node: every container is killed at once (no grace: the node is gone),
// the controllers stop, and the directory is removed if Start made it (set
// WASMESH_KEEP_KUBENODE_DIR to keep it).
func (n *Node) Close() { n.closeOnce.Do(n.close) }

func (n *Node) close() {
	if n.cancel != nil {
		n.cancel()
		n.controllers.Wait()
		n.mu.Lock()
		all := n.all
		n.mu.Unlock()
		for _, r := range all {
			r.wait()
		}
		n.broadcaster.Shutdown()
	}
	if n.kubeletAPI != nil {
		_ = n.kubeletAPI.Close()
	}
	if n.claim != nil {
		n.claim.Close()
	}
	if n.ownDir && os.Getenv("WASMESH_KEEP_KUBENODE_DIR") == "" {
		_ = os.RemoveAll(n.dir)
	}
}

func (n *Node) logf(format string, args ...any) {
	if n.opts.Logf != nil {
		n.opts.Logf(format, args...)
	}
}

func (n *Node) event(r *podRun, kind, reason, msg string) {
	n.recorder.Event(r.podCopy(), kind, reason, msg)
}

func (n *Node) notifier() func(*corev1.Pod) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.notify
}

// forget drops an ended pod from the node's pods.
func (n *Node) forget(r *podRun) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pods[r.key] == r {
		delete(n.pods, r.key)
	}
}
