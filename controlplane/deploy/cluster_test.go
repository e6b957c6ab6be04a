package deploy

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/ca/catest"
	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

const (
	namespace      = "istio-system"
	serviceAccount = "istiod"
	webhookConfig  = "istio-validator-istio-system"
	injectorConfig = "istio-sidecar-injector"
	leaseName      = "istiod-leader"
	caSecret       = "istio-ca-secret"
	// pluggedCASecret is Istio's cacerts; rootConfigMap the CA's root in every namespace.
	pluggedCASecret = "cacerts"
	rootConfigMap   = "istio-ca-root-cert"
)

// kubectl runs the cluster's kubectl as its admin.
type kubectl struct {
	bin, kubeconfig string
}

func (k kubectl) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(k.bin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// Every manifest is accepted by a real API server (server-side dry run, then applied), the
// service account can do what discovery does and nothing else, and discovery running with
// the service account's token syncs, writes the status of an object it rejects, and watches
// a CRD installed after it started.
func TestManifestsOnARealAPIServer(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	binDir, err := kubecluster.BinDir()
	require.NoError(t, err)
	k := kubectl{bin: filepath.Join(binDir, "kubectl"), kubeconfig: c.Kubeconfig}
	dir := t.TempDir()
	file, err := IstioCRDFile(".")
	require.NoError(t, err)
	istio, err := os.ReadFile(file)
	require.NoError(t, err)
	require.NoError(t, Write(dir, istio, Options{}))
	ms, err := Manifests()
	require.NoError(t, err)
	crds := filepath.Join(dir, CRDFile)

	// The CRDs for real first: kubectl apply -f build/deploy/ applies them last, and nothing
	// before them needs them, but the service account's checks and discovery below do.
	k.run(t, "apply", "--server-side", "-f", crds)
	k.run(t, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
	// A server dry run creates nothing, so the namespaced objects' dry run needs the namespace
	// for real: its own dry run, then the namespace.
	nsFile := filepath.Join(dir, ms[0].Name)
	requireDryRunApplies(t, k.run(t, "apply", "--server-side", "--dry-run=server", "-f", nsFile), 1)
	k.run(t, "apply", "--server-side", "-f", nsFile)

	// Every manifest, as `kubectl apply -f build/deploy/` would apply them.
	want := len(objects(t)) + len(ServedKinds())
	requireDryRunApplies(t, k.run(t, "apply", "--server-side", "--dry-run=server", "-f", dir), want)

	// For real, but the webhook configurations: nothing here serves them, and the Istio
	// objects the test writes below would wait out the timeout on the unreachable Service.
	for _, m := range ms {
		if !strings.Contains(m.Name, "webhookconfiguration") {
			k.run(t, "apply", "--server-side", "-f", filepath.Join(dir, m.Name))
		}
	}

	t.Run("least privilege", func(t *testing.T) { checkAccess(t, c) })
	t.Run("discovery syncs as the service account", func(t *testing.T) { runAsServiceAccount(t, c, k, crds) })
}

// requireDryRunApplies checks kubectl's output: every object applied in the dry run, and no
// warning (a Deployment breaking the namespace's Pod Security level is only a warning).
func requireDryRunApplies(t *testing.T, out string, objects int) {
	t.Helper()
	t.Logf("kubectl apply --server-side --dry-run=server:\n%s", out)
	assert.NotContains(t, out, "Warning")
	assert.Equal(t, objects, strings.Count(out, "serverside-applied (server dry run)"), out)
}

// access is one request the service account makes, or must not be able to make.
type access struct {
	verb, group, resource, subresource, namespace, name string
}

func (a access) String() string {
	res := a.resource
	if a.group != "" {
		res += "." + a.group
	}
	if a.name != "" {
		res += "/" + a.name
	}
	s := "kubectl auth can-i " + a.verb + " " + res
	if a.subresource != "" {
		s += " --subresource=" + a.subresource
	}
	if a.namespace != "" {
		s += " -n " + a.namespace
	} else {
		s += " -A"
	}
	return s + " --as=system:serviceaccount:" + namespace + ":" + serviceAccount
}

// canI asks the API server what `kubectl auth can-i --as` asks: whether the service
// account (its user and groups) may make the request.
func canI(t *testing.T, c *kubecluster.Cluster, a access) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace, Name: a.name,
		},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	require.NoError(t, err, a.String())
	return got.Status.Allowed
}

func checkAccess(t *testing.T, c *kubecluster.Cluster) {
	var allowed, denied []access
	for _, r := range []string{"services", "pods", "nodes", "namespaces"} {
		allowed = append(allowed, access{verb: "list", resource: r}, access{verb: "watch", resource: r})
		denied = append(denied, access{verb: "get", resource: r, namespace: "demo", name: "x"})
	}
	allowed = append(allowed, access{verb: "list", group: "discovery.k8s.io", resource: "endpointslices"},
		access{verb: "watch", group: "discovery.k8s.io", resource: "endpointslices"},
		access{verb: "list", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
		access{verb: "watch", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"})
	for _, gr := range istioKinds(t) {
		g, r := gr[0], gr[1]
		allowed = append(allowed, access{verb: "list", group: g, resource: r}, access{verb: "watch", group: g, resource: r},
			access{verb: "patch", group: g, resource: r, subresource: "status", namespace: "demo", name: "x"})
		for _, v := range []string{"create", "update", "patch", "delete"} {
			denied = append(denied, access{verb: v, group: g, resource: r, namespace: "demo", name: "x"})
		}
		denied = append(denied, access{verb: "update", group: g, resource: r, subresource: "status", namespace: "demo", name: "x"})
	}
	// Its own webhook configuration, the Lease and the CA Secret: by name.
	for _, v := range []string{"get", "list", "watch", "patch", "update"} {
		allowed = append(allowed, access{verb: v, group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: webhookConfig},
			access{verb: v, group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: injectorConfig})
		denied = append(denied, access{verb: v, group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "someone-elses"},
			access{verb: v, group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: webhookConfig})
	}
	allowed = append(allowed,
		access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: namespace},
		access{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: leaseName},
		access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: leaseName},
		access{verb: "create", resource: "secrets", namespace: namespace},
		access{verb: "get", resource: "secrets", namespace: namespace, name: caSecret},
		access{verb: "watch", resource: "secrets", namespace: namespace, name: caSecret},
		access{verb: "get", resource: "secrets", namespace: namespace, name: pluggedCASecret})
	allowed = append(allowed, caAccess()...)
	denied = append(denied, deniedElsewhere()...)

	for _, a := range allowed {
		assert.True(t, canI(t, c, a), "allowed: %s", a)
	}
	for _, a := range denied {
		assert.False(t, canI(t, c, a), "denied: %s", a)
	}
	t.Logf("%d requests allowed and %d denied as expected", len(allowed), len(denied))
}

// caAccess: the CA's TokenReviews, and its root ConfigMap in every namespace (create on
// any ConfigMap: RBAC cannot limit create by name; the rest by name, list and watch selecting
// it).
func caAccess() []access {
	out := []access{{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
		{verb: "create", resource: "configmaps", namespace: "demo"}}
	for _, v := range []string{"get", "update", "list", "watch"} {
		out = append(out, access{verb: v, resource: "configmaps", namespace: "demo", name: rootConfigMap})
	}
	return append(out, access{verb: "list", resource: "configmaps", name: rootConfigMap}, access{verb: "watch", resource: "configmaps", name: rootConfigMap})
}

// deniedElsewhere: writes to workloads and Services, other webhook configurations, Secrets
// and Leases other than its own, and anything outside its namespace that it only reads.
func deniedElsewhere() []access {
	var out []access
	for _, v := range []string{"create", "update", "patch", "delete"} {
		out = append(out, access{verb: v, resource: "services", namespace: "demo", name: "x"},
			access{verb: v, resource: "pods", namespace: "demo", name: "x"},
			access{verb: v, group: "discovery.k8s.io", resource: "endpointslices", namespace: "demo", name: "x"},
			access{verb: v, group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "virtualservices.networking.istio.io"})
	}
	return append(out,
		access{verb: "list", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations"},
		access{verb: "list", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations"},
		access{verb: "delete", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: injectorConfig},
		access{verb: "create", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations"},
		access{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: webhookConfig},
		access{verb: "list", resource: "secrets", namespace: namespace},
		access{verb: "get", resource: "secrets", namespace: namespace, name: "someone-elses"},
		access{verb: "update", resource: "secrets", namespace: namespace, name: caSecret},
		access{verb: "delete", resource: "secrets", namespace: namespace, name: caSecret},
		access{verb: "get", resource: "secrets", namespace: "demo", name: caSecret},
		access{verb: "create", resource: "secrets", namespace: "demo"},
		access{verb: "list", resource: "secrets"},
		access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "someone-elses"},
		access{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: leaseName},
		access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "demo"},
		access{verb: "get", resource: "configmaps", namespace: namespace, name: "istio"},
		access{verb: "list", resource: "configmaps"},
		access{verb: "list", resource: "configmaps", namespace: "demo"},
		access{verb: "update", resource: "configmaps", namespace: "demo", name: "someone-elses"},
		access{verb: "delete", resource: "configmaps", namespace: "demo", name: rootConfigMap},
		access{verb: "update", resource: "secrets", namespace: namespace, name: pluggedCASecret},
		access{verb: "list", resource: "secrets", namespace: namespace, name: pluggedCASecret},
		access{verb: "get", resource: "secrets", namespace: "demo", name: pluggedCASecret},
		access{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
		access{verb: "create", resource: "events", namespace: namespace},
		access{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: namespace, name: serviceAccount},
		access{verb: "bind", group: "rbac.authorization.k8s.io", resource: "clusterroles", name: "cluster-admin"},
		access{verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: namespace},
	)
}

// syncBuffer is a bytes.Buffer the process writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serviceAccountKubeconfig writes a kubeconfig holding a token of the service account, made
// by the TokenRequest API as the kubelet makes a pod's.
func serviceAccountKubeconfig(t *testing.T, c *kubecluster.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	expiry := int64(3600)
	tok, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: c.Server(), CertificateAuthority: c.CAFile()}
	cfg.AuthInfos["istiod"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["istiod"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "istiod"}
	cfg.CurrentContext = "istiod"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// discoveryBinary is $WASMESH_BIN_DIR/discovery (make test builds it), else built here.
func discoveryBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "discovery")); err == nil {
			return filepath.Join(dir, "discovery")
		}
	}
	bin := filepath.Join(t.TempDir(), "discovery")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/wasmesh/wasmesh/controlplane/cmd/discovery").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// podCommand is the Deployment's container as this machine runs it: its arguments (the
// addresses on loopback, its files in dir, the ConfigMaps' mesh config and injector
// configuration where the Deployment mounts them) and its environment from the downward API.
func podCommand(t *testing.T, dir, kubeconfig string) (args, env []string, httpAddr, secureAddr string) {
	t.Helper()
	objs := objects(t)
	d := object[*appsv1.Deployment](t, objs, "Deployment/istiod")
	c := d.Spec.Template.Spec.Containers[0]
	mesh := filepath.Join(dir, "mesh")
	require.NoError(t, os.WriteFile(mesh, []byte(object[*corev1.ConfigMap](t, objs, "ConfigMap/istio").Data["mesh"]), 0o644))
	injectDir := filepath.Join(dir, "inject")
	require.NoError(t, os.Mkdir(injectDir, 0o755))
	for k, v := range object[*corev1.ConfigMap](t, objs, "ConfigMap/istio-sidecar-injector").Data {
		require.NoError(t, os.WriteFile(filepath.Join(injectDir, k), []byte(v), 0o644))
	}
	httpAddr = freeAddr(t)
	local := map[string]string{
		"--httpAddr": httpAddr, "--meshConfig": mesh, "--wasmCacheDir": filepath.Join(dir, "wasm"),
		"--injectConfigDir": injectDir,
	}
	for _, a := range c.Args {
		name, _, _ := strings.Cut(a, "=")
		if v, ok := local[name]; ok {
			a = name + "=" + v
		}
		args = append(args, a)
	}
	secureAddr = freeAddr(t) // the Deployment's 15012 is the default
	args = append(args, "--kubeconfig="+kubeconfig, "--secureGRPCAddr="+secureAddr)
	fields := map[string]string{"metadata.name": "istiod-0", "metadata.namespace": namespace}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env = append(env, e.Name+"="+fields[e.ValueFrom.FieldRef.FieldPath])
		}
	}
	return args, env, httpAddr, secureAddr
}

// runAsServiceAccount runs discovery as the Deployment runs it, with the service account's
// token: it must become ready (every informer listed), sign a workload's certificate for its
// token and publish the CA's root, write the status of an object it rejects, and watch a kind
// whose CRD is installed after it started.
func runAsServiceAccount(t *testing.T, c *kubecluster.Cluster, k kubectl, crds string) {
	for _, doc := range []string{brokenVirtualService, brokenTelemetry} {
		parsed := config.ParseFile("broken.yaml", []byte(doc))
		require.Len(t, parsed, 1)
		require.NotNil(t, parsed[0].Err, "discovery must reject:\n%s", doc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Telemetry's CRD goes before discovery starts and comes back after.
	k.run(t, "delete", "crd", "telemetries.telemetry.istio.io")

	args, env, httpAddr, secureAddr := podCommand(t, t.TempDir(), serviceAccountKubeconfig(t, c))
	cmd := exec.Command(discoveryBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	t.Logf("discovery %s", strings.Join(args, " "))

	waitReady(t, ctx, httpAddr, exited, &stderr)
	checkCA(t, ctx, c, secureAddr)
	vs := applyBroken(t, k, brokenVirtualService)
	k.run(t, "apply", "--server-side", "-f", crds)
	k.run(t, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
	tel := applyBroken(t, k, brokenTelemetry)
	for _, obj := range []string{vs, tel} {
		waitStatusWritten(t, ctx, k, obj, &stderr)
	}
	assert.NotContains(t, strings.ToLower(stderr.String()), "forbidden", "discovery was refused something:\n%s", stderr.String())
}

func waitReady(t *testing.T, ctx context.Context, httpAddr string, exited <-chan error, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, err := http.Get("http://" + httpAddr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("discovery exited: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("discovery not ready as the service account: %v\n%s", ctx.Err(), stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Both pass the CRDs' schemas; discovery's validation rejects them (only HTTP routes are
// translated; access logging is not supported).
const (
	brokenVirtualService = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken, namespace: demo}
spec:
  hosts: [reviews]
  tcp: [{route: [{destination: {host: reviews}}]}]
`
	brokenTelemetry = `apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: broken, namespace: demo}
spec:
  accessLogging: [{providers: [{name: envoy}]}]
`
)

// applyBroken applies doc and returns the kubectl name of the object.
func applyBroken(t *testing.T, k kubectl, doc string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "broken.yaml")
	require.NoError(t, os.WriteFile(f, []byte(doc), 0o644))
	k.run(t, "apply", "--server-side", "-f", f)
	return strings.TrimSpace(k.run(t, "get", "-f", f, "-o", "name"))
}

// waitStatusWritten waits until the object's status carries discovery's IST0106 message
// (kubectl wait watches it).
func waitStatusWritten(t *testing.T, ctx context.Context, k kubectl, obj string, stderr *syncBuffer) {
	t.Helper()
	cmd := exec.CommandContext(ctx, k.bin, "--kubeconfig", k.kubeconfig, "wait", "-n", "demo", obj,
		"--for=jsonpath={.status.validationMessages[0].type.code}=IST0106", "--timeout=60s")
	out, err := cmd.CombinedOutput()
	if err != nil {
		status := k.run(t, "get", "-n", "demo", obj, "-o", "jsonpath={.status}")
		t.Fatalf("%s: discovery did not write its status: %v\n%s\nstatus: %s\ndiscovery:\n%s", obj, err, out, status, stderr.String())
	}
}

// checkCA: discovery, as the service account, checks a workload's token with TokenReview
// and signs its certificate on the secure port, and (leading) publishes the root in every
// namespace.
func checkCA(t *testing.T, ctx context.Context, c *kubecluster.Cluster, secureAddr string) {
	t.Helper()
	var root []byte
	require.Eventually(t, func() bool {
		sec, err := c.Client.CoreV1().Secrets(namespace).Get(ctx, caSecret, metav1.GetOptions{})
		if err != nil {
			return false
		}
		root = sec.Data[ca.RootCertFile]
		return true
	}, time.Minute, 20*time.Millisecond, "discovery creates the CA Secret")
	require.Eventually(t, func() bool {
		cm, err := c.Client.CoreV1().ConfigMaps("demo").Get(ctx, rootConfigMap, metav1.GetOptions{})
		return err == nil && cm.Data[ca.RootCertFile] == string(root)
	}, time.Minute, 20*time.Millisecond, "the leader publishes the root")
	tok := catest.Token(t, c.Client, "demo", "reviews", ca.CredentialAudience)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(root))
	_, csr := catest.NewCSR(t)
	resp, err := catest.Client(t, secureAddr, roots, nil).CreateCertificate(catest.WithToken(ctx, tok),
		&securityv1alpha1.IstioCertificateRequest{Csr: csr})
	require.NoError(t, err)
	assert.Equal(t, "spiffe://cluster.local/ns/demo/sa/reviews", catest.Leaf(t, resp, root).URIs[0].String())
}
