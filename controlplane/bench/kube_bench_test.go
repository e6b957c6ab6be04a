package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/source/kube"
)

// The Kubernetes benchmark's mesh: services in the proxies' namespace, kubePodsPer pods
// each, on kubeNodes nodes in two zones.
const (
	kubePodsPer = 4
	kubeNodes   = 4
	// kubeIdle is how long the API server's requests are counted while nothing changes.
	kubeIdle = 30 * time.Second
)

// BenchmarkKubernetes serves the proxies from a real API server (kubecluster: etcd and
// kube-apiserver, no controller-manager) holding 1000 Services with selectors, one
// EndpointSlice each (written by the benchmark, as the EndpointSlice controller would: 4
// endpoints with their pods as targetRef), 4000 Pods (Running and Ready, podIP set through
// the status subresource) on 4 Nodes with topology labels, and every Istio CRD. Discovery
// runs as its own process (the bin/discovery command, built if WASMESH_BIN_DIR lacks it),
// with the command's defaults (leader election on a Lease, the webhook) except admission
// control, which would pace the proxies' connections (PILOT_MAX_REQUESTS_PER_SECOND=0).
// 2000 delta ADS clients (xdsload) connect once it is ready.
//
// "source=directory" is the baseline: the same services as ServiceEntries with 4
// WorkloadEntries each in a config directory, the same proxies; its change writes a
// WorkloadEntry of svc-0 into the directory. "source=kubernetes"'s change adds an endpoint
// to svc-0's EndpointSlice. Each line reports, besides the change's time to the last
// proxy's ACK (ms-to-last-ack, ms-beyond-debounce; every proxy watches svc-0), the CPU of
// discovery and of the load client per change, discovery's pushes per change by type
// (eds-pushes/op; cds-, lds-, rds-pushes/op are 0 when the change pushes endpoints only),
// and what was
// measured once before it: ready-s (process start to /ready: the sources listed, the first
// snapshot built), initial-sync-s (process start to every proxy holding its config),
// rss-MiB (VmRSS of the discovery process with the proxies connected, after the idle
// period), heap-inuse-MiB (its go_memstats_heap_inuse_bytes then: the heap's spans in use,
// garbage not yet collected included), and the API server's non-WATCH requests per minute
// over 30 s without any change (apiserver-nonwatch-req/min; in the directory run, discovery
// does not talk to the API server: what the API server does alone). The Kubernetes line adds
// discovery's share of those (discovery-nonwatch-req/min; discovery-lease-req/min are the
// leader's Lease renewals among them), the watches it holds open (discovery-watches), and
// ratios to the directory run (*-kube/dir). WASMESH_BENCH_KUBE_SCALE=SERVICESxPROXIES
// changes the scale (default 1000x2000).
func BenchmarkKubernetes(b *testing.B) {
	kubecluster.RequireBinaries(b)
	sc := Scale{Services: 1000, Proxies: 2000}
	if spec := os.Getenv("WASMESH_BENCH_KUBE_SCALE"); spec != "" {
		scales, err := ParseScales(spec)
		require.NoError(b, err)
		sc = scales[0]
	}
	tmp := b.TempDir()
	loader, err := LoaderBinary(tmp)
	require.NoError(b, err)
	disc, err := Binary(tmp, "discovery")
	require.NoError(b, err)
	c := kubecluster.ForTest(b, kubecluster.Options{}, kubeIstioKinds()...)
	kc := populateKube(b, c, sc.Services)

	dir := b.TempDir()
	require.NoError(b, os.WriteFile(filepath.Join(dir, "services.yaml"), []byte(kubeServiceEntries(sc.Services)), 0o644))
	r := &kubeRun{b: b, cluster: c, loaderBin: loader, discoveryBin: disc, proxies: sc.Proxies}
	var base kubeFigures
	b.Run("source=directory", func(b *testing.B) {
		base = r.serve(b, nil, []string{"--configDir", dir}, func(seq int, ip string) {
			name := fmt.Sprintf("extra-%d", seq)
			require.NoError(b, os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(WorkloadEntryNamed("load", name, "svc-0", ip)), 0o644))
		})
	})
	slices := kc.DiscoveryV1().EndpointSlices("load")
	slice, err := slices.Get(context.Background(), "svc-0-slice", metav1.GetOptions{})
	require.NoError(b, err)
	kubeArgs := []string{"--registries", "Kubernetes", "--kubeconfig", c.Kubeconfig, "--namespace", "istio-system", "--webhookAddr", freeAddr(b),
		"--secureGRPCAddr", freeAddr(b)}
	b.Run("source=kubernetes", func(b *testing.B) {
		r.serve(b, &base, kubeArgs, func(_ int, ip string) {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
			slice, err = slices.Update(context.Background(), slice, metav1.UpdateOptions{})
			require.NoError(b, err)
		})
	})
}

// kubeFigures is what one source's run measured, for the ratios.
type kubeFigures struct {
	initialSync    time.Duration
	rss            float64
	beyondDebounce float64 // ms
	idleRequests   float64 // the API server's non-WATCH requests per minute
	idleByKind     map[string]float64
	watches        float64
}

// kubeRun is what both sources' runs share.
type kubeRun struct {
	b                       *testing.B
	cluster                 *kubecluster.Cluster
	loaderBin, discoveryBin string
	proxies                 int
	seq                     int
}

// serve starts discovery with args, connects the proxies, counts the API server's requests
// while idle, then measures change (which adds ip to svc-0's endpoints) b.N times in a
// "change=endpoints" line reporting everything. base, when set, is the directory run's.
func (r *kubeRun) serve(b *testing.B, base *kubeFigures, args []string, change func(seq int, ip string)) kubeFigures {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := startDiscoveryProcess(b, r.discoveryBin, args)
	defer p.stop()
	loader, err := StartLoader(ctx, r.loaderBin, p.grpcAddr, r.proxies, true, 0)
	require.NoError(b, err)
	defer loader.Stop()
	var f kubeFigures
	f.initialSync = time.Since(p.started)
	ready := p.ready.Sub(p.started)

	before := apiServerRequests(b, r.cluster)
	time.Sleep(kubeIdle)
	after := apiServerRequests(b, r.cluster)
	f.idleByKind = map[string]float64{}
	for k, v := range after.total {
		if d := v - before.total[k]; d > 0 && !strings.HasPrefix(k, "WATCH ") {
			f.idleByKind[k] = d / kubeIdle.Minutes()
			f.idleRequests += f.idleByKind[k]
		}
	}
	f.watches = after.watches
	b.Logf("%s: the API server's non-WATCH requests per minute while idle, by verb and resource: %v; open watches: %v", b.Name(), f.idleByKind, f.watches)
	f.rss = processRSS(b, p.cmd.Process.Pid)
	heap := 0.0
	for _, s := range p.metrics(b) {
		if s.name == "go_memstats_heap_inuse_bytes" {
			heap = s.value
		}
	}

	debounce := push.DefaultDebounce().After
	b.Run("change=endpoints", func(b *testing.B) {
		serverBefore, clientBefore, pushesBefore := ProcessCPU(p.cmd.Process.Pid), loader.CPU(), p.pushes(b)
		watchers := 0
		mean := timeChanges(b, debounce, func(int) (time.Time, time.Time) {
			r.seq++
			ip := fmt.Sprintf("10.200.%d.%d", r.seq/256%256, r.seq%256)
			start := time.Now()
			change(r.seq, ip)
			last, n, err := loader.WaitCount(fmt.Sprintf("endpoint-watchers %s %s", ClusterName(0), ip))
			require.NoError(b, err)
			watchers = n
			return start, last
		})
		f.beyondDebounce = float64((mean - debounce).Microseconds()) / 1000
		n := float64(b.N)
		b.ReportMetric((ProcessCPU(p.cmd.Process.Pid)-serverBefore).Seconds()/n, "server-cpu-s/op")
		b.ReportMetric((loader.CPU()-clientBefore).Seconds()/n, "client-cpu-s/op")
		b.ReportMetric(float64(watchers), "watching-proxies")
		// Proof that a change of endpoints pushes endpoints only (no full push).
		for typ, v := range p.pushes(b) {
			b.ReportMetric((v-pushesBefore[typ])/n, typ+"-pushes/op")
		}
		b.ReportMetric(ready.Seconds(), "ready-s")
		b.ReportMetric(f.initialSync.Seconds(), "initial-sync-s")
		b.ReportMetric(f.rss/(1<<20), "rss-MiB")
		b.ReportMetric(heap/(1<<20), "heap-inuse-MiB")
		b.ReportMetric(f.idleRequests, "apiserver-nonwatch-req/min")
		if base != nil {
			f.reportAgainst(b, base)
		}
	})
	return f
}

// reportAgainst reports discovery's share of the API server's idle requests and watches
// (beyond the directory run's, where discovery does not use it) and the ratios to base.
func (f *kubeFigures) reportAgainst(b *testing.B, base *kubeFigures) {
	leases := 0.0
	for k, v := range f.idleByKind {
		if strings.HasSuffix(k, " leases") {
			leases += v - base.idleByKind[k]
		}
	}
	b.ReportMetric(f.idleRequests-base.idleRequests, "discovery-nonwatch-req/min")
	b.ReportMetric(leases, "discovery-lease-req/min")
	b.ReportMetric(f.watches-base.watches, "discovery-watches")
	b.ReportMetric(f.initialSync.Seconds()/base.initialSync.Seconds(), "initial-sync-kube/dir")
	b.ReportMetric(f.rss/base.rss, "rss-kube/dir")
	if base.beyondDebounce > 0 {
		b.ReportMetric(f.beyondDebounce/base.beyondDebounce, "ms-beyond-debounce-kube/dir")
	}
}

// discoveryProcess is bin/discovery running for a benchmark.
type discoveryProcess struct {
	cmd                *exec.Cmd
	grpcAddr, httpAddr string
	started, ready     time.Time
	done               chan struct{}
}

// startDiscoveryProcess starts discovery on free loopback ports, its log on stderr at warn
// level, and waits until /ready answers.
func startDiscoveryProcess(b *testing.B, bin string, args []string) *discoveryProcess {
	p := &discoveryProcess{grpcAddr: freeAddr(b), httpAddr: freeAddr(b), done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--grpcAddr", p.grpcAddr, "--httpAddr", p.httpAddr, "--log_output_level", "default:warn"}, args...)...)
	p.cmd.Env = append(os.Environ(), "PILOT_MAX_REQUESTS_PER_SECOND=0")
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.started = time.Now()
	require.NoError(b, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Now()
				return p
			}
		}
		select {
		case <-p.done:
			b.Fatalf("discovery exited before it was ready: %v", p.cmd.ProcessState)
		case <-time.After(10 * time.Millisecond):
		}
		require.Less(b, time.Since(p.started), 5*time.Minute, "discovery never ready")
	}
}

func (p *discoveryProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// processRSS is a process's resident set (VmRSS), in bytes: a discovery process, or this
// one (the server, in the push benchmark: its load clients are another process).
func processRSS(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(b, err)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			kb, err := strconv.ParseFloat(f[1], 64)
			require.NoError(b, err)
			return kb * 1024
		}
	}
	b.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// metrics reads discovery's /metrics.
func (p *discoveryProcess) metrics(b *testing.B) []promSample {
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	require.NoError(b, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	return promSamples(b, string(body))
}

// pushes is discovery's pilot_xds_pushes by type (cds, eds, lds, rds).
func (p *discoveryProcess) pushes(b *testing.B) map[string]float64 {
	out := map[string]float64{}
	for _, s := range p.metrics(b) {
		if s.name == "pilot_xds_pushes" {
			out[s.labels["type"]] += s.value
		}
	}
	return out
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer l.Close()
	return l.Addr().String()
}

// apiRequestCounts is what the API server's /metrics says of the requests it served:
// apiserver_request_total by "VERB resource", and the WATCH requests open now.
type apiRequestCounts struct {
	total   map[string]float64
	watches float64
}

// promSample is one sample of the Prometheus text format.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

var promLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// promSamples parses the Prometheus text format (label values without escaped quotes).
func promSamples(b *testing.B, text string) []promSample {
	var out []promSample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := promSample{labels: map[string]string{}}
		rest := line
		if name, labels, ok := strings.Cut(line, "{"); ok {
			i := strings.LastIndexByte(labels, '}')
			for _, m := range promLabel.FindAllStringSubmatch(labels[:i], -1) {
				s.labels[m[1]] = m[2]
			}
			s.name, rest = name, labels[i+1:]
		} else {
			s.name, rest, _ = strings.Cut(line, " ")
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		require.NoError(b, err, line)
		s.value = v
		out = append(out, s)
	}
	return out
}

// apiServerRequests reads the API server's /metrics (itself a request, counted in the next
// reading the same way in every run).
func apiServerRequests(b *testing.B, c *kubecluster.Cluster) apiRequestCounts {
	body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	require.NoError(b, err)
	out := apiRequestCounts{total: map[string]float64{}}
	for _, s := range promSamples(b, string(body)) {
		switch {
		case s.name == "apiserver_longrunning_requests" && s.labels["verb"] == "WATCH":
			out.watches += s.value
		case s.name == "apiserver_request_total":
			out.total[s.labels["verb"]+" "+s.labels["resource"]] += s.value
		}
	}
	return out
}

// kubeIstioKinds are the kinds whose CRDs the cluster gets: every kind the source watches.
func kubeIstioKinds() []string {
	var out []string
	for _, k := range kube.DefaultIstioKinds() {
		out = append(out, string(k))
	}
	return out
}

// kubeServiceEntries is the directory's equivalent of populateKube: ServiceEntry(i) and
// kubePodsPer WorkloadEntries at the pods' addresses.
func kubeServiceEntries(services int) string {
	var sb strings.Builder
	for i := range services {
		fmt.Fprintf(&sb, "---\n%s", ServiceEntry(i))
		for k := range kubePodsPer {
			fmt.Fprintf(&sb, "---\n%s", WorkloadEntryNamed("load", kubePodName(i, k), fmt.Sprintf("svc-%d", i), IP(i*kubePodsPer+k)))
		}
	}
	return sb.String()
}

func kubePodName(service, k int) string { return fmt.Sprintf("svc-%d-%d", service, k) }

// populateKube creates the namespaces, nodes, services, pods and EndpointSlices, and returns
// the unthrottled clientset it used.
func populateKube(b *testing.B, c *kubecluster.Cluster, services int) kubernetes.Interface {
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	kc, err := kubernetes.NewForConfig(cfg)
	require.NoError(b, err)
	ctx := context.Background()
	for _, ns := range []string{"load", "istio-system"} {
		_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(b, err)
	}
	// No controller-manager makes the namespace's default ServiceAccount, which pods need.
	_, err = kc.CoreV1().ServiceAccounts("load").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(b, err)
	for n := range kubeNodes {
		_, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kubeNodeName(n),
			Labels: map[string]string{corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: kubeZone(n)}}}, metav1.CreateOptions{})
		require.NoError(b, err)
	}
	parallel(b, services, func(i int) error { return createKubeService(ctx, kc, i) })
	warmCustomResources(b, c)
	return kc
}

// warmCustomResources lists every custom resource once: the API server sets up a CRD's
// storage on its first request (about 0.1 to 0.6 s each here), which a cluster that has
// served them already has done, and which would otherwise fall into discovery's start.
func warmCustomResources(b *testing.B, c *kubecluster.Cluster) {
	ctx := context.Background()
	dc, err := dynamic.NewForConfig(c.Config)
	require.NoError(b, err)
	crds, err := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}).List(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	for _, crd := range crds.Items {
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		for _, v := range versions {
			name, _, _ := unstructured.NestedString(v.(map[string]any), "name")
			_, err := dc.Resource(schema.GroupVersionResource{Group: group, Version: name, Resource: plural}).List(ctx, metav1.ListOptions{})
			require.NoError(b, err)
		}
	}
}

func kubeNodeName(n int) string { return fmt.Sprintf("node-%d", n) }
func kubeZone(n int) string     { return fmt.Sprintf("zone-%d", n%2) }

// createKubeService creates service i, its pods (Running and Ready, at their addresses) and
// its EndpointSlice.
func createKubeService(ctx context.Context, kc kubernetes.Interface, i int) error {
	app := fmt.Sprintf("svc-%d", i)
	_, err := kc.CoreV1().Services("load").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: app + "-slice", Labels: map[string]string{discoveryv1.LabelServiceName: app}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}}}
	for k := range kubePodsPer {
		name, ip, node := kubePodName(i, k), IP(i*kubePodsPer+k), (i*kubePodsPer+k)%kubeNodes
		pod, err := kc.CoreV1().Pods("load").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: kubeNodeName(node), Containers: []corev1.Container{{Name: "app", Image: "app"}}}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := kc.CoreV1().Pods("load").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			return err
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "load", Name: name}, NodeName: ptr(kubeNodeName(node)), Zone: ptr(kubeZone(node))})
	}
	_, err = kc.DiscoveryV1().EndpointSlices("load").Create(ctx, slice, metav1.CreateOptions{})
	return err
}

// parallel runs f(0..n-1) on a few goroutines and fails b with the first error.
func parallel(b *testing.B, n int, f func(i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
}

func ptr[T any](v T) *T { return &v }
