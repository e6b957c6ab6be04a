package kubemesh

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/agent/sidecar"
	"github.com/wasmesh/wasmesh/controlplane/deploy"
	"github.com/wasmesh/wasmesh/controlplane/inject"
)

const (
	// DiscoveryNamespace, DiscoveryDeployment and DiscoveryService are controlplane/deploy's.
	DiscoveryNamespace  = "istio-system"
	DiscoveryDeployment = "istiod"
	DiscoveryService    = "istiod"
	// discoveryKubeconfig is the ConfigMap holding the kubeconfig the replicas read, and
	// kubeAPIDir where their projected volume of it, the token and the CA is mounted.
	discoveryKubeconfig = "discovery-kubeconfig"
	kubeAPIDir          = "/var/run/wasmesh/kube-api"
	deploymentFile      = "40-deployment.yaml"
	meshConfigFile      = "30-configmap.yaml"
	injectorConfigFile  = "35-sidecar-injector-configmap.yaml"
)

// installDiscovery applies controlplane/deploy's manifests (the namespace, service account,
// RBAC, mesh config, the injector's configuration, the 2-replica Deployment, the Service, the
// PodDisruptionBudget and the webhook configurations) with kubectl apply --server-side, after
// the Istio CRDs: the Deployment adjusted for a node whose pods share one network
// (localDeployment), the mesh config and the injector's values for sidecars that are
// processes of this machine (localMeshConfig, localInjectorValues).
func (m *Mesh) installDiscovery(ctx context.Context) error {
	if err := m.Cluster.InstallIstioCRDs(ctx, deploy.ServedKinds()...); err != nil {
		return err
	}
	ms, err := deploy.Manifests()
	if err != nil {
		return err
	}
	dir := filepath.Join(m.dir, "deploy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	local := map[string]func([]byte) ([]byte, error){deploymentFile: m.localDeployment,
		meshConfigFile: m.localMeshConfig, injectorConfigFile: m.localInjectorValues}
	for _, mf := range ms {
		data := mf.Data
		if f := local[mf.Name]; f != nil {
			if data, err = f(data); err != nil {
				return fmt.Errorf("%s: %w", mf.Name, err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, mf.Name), data, 0o644); err != nil {
			return err
		}
	}
	// The namespace first: the kubeconfig ConfigMap below lives in it.
	if _, err := m.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(dir, ms[0].Name)); err != nil {
		return err
	}
	if err := m.writeDiscoveryKubeconfig(ctx); err != nil {
		return err
	}
	_, err = m.Kubectl(ctx, "apply", "--server-side", "-f", dir)
	return err
}

// localDeployment is the discovery Deployment of the manifests with what running its pods
// as processes of one machine needs, and nothing else changed:
//   - the xDS, debug and webhook servers bind the pod IP ($(WASMESH_WILDCARD), which the
//     node sets) rather than every address, which two replicas sharing one network would
//     both want;
//   - the replicas reach the API server through a kubeconfig (--kubeconfig) that uses the
//     pod's service-account token, from a projected volume: in-cluster configuration reads
//     a fixed path that a process of this machine does not have;
//   - --mtls: the sample's traffic is mutual TLS, as in the local mesh with identity;
//   - --leaseDuration when Options.LeaseDuration is set (the tests shorten the 30 s lease).
func (m *Mesh) localDeployment(data []byte) ([]byte, error) {
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", deploymentFile, err)
	}
	spec := &d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return nil, fmt.Errorf("%s: want one container, found %d", deploymentFile, len(spec.Containers))
	}
	c := &spec.Containers[0]
	for i, a := range c.Args {
		for _, flag := range []string{"--grpcAddr=:", "--httpAddr=:", "--webhookAddr=:"} {
			if strings.HasPrefix(a, flag) {
				c.Args[i] = strings.TrimSuffix(flag, ":") + "$(WASMESH_WILDCARD):" + strings.TrimPrefix(a, flag)
			}
		}
	}
	if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--webhookAddr") }) {
		c.Args = append(c.Args, "--webhookAddr=$(WASMESH_WILDCARD):15017")
	}
	// The secure port (xDS and the CA, TLS) on the pod IP too, where the service proxy m.XDS
	// sends the sidecars; and mutual TLS between the workloads.
	c.Args = append(c.Args, "--secureGRPCAddr=$(WASMESH_WILDCARD):15012", "--mtls")
	c.Args = append(c.Args, "--kubeconfig="+kubeAPIDir+"/kubeconfig")
	if m.opts.LeaseDuration > 0 {
		c.Args = append(c.Args, "--leaseDuration="+m.opts.LeaseDuration.String())
	}
	expiry := int64(3600)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "kube-api", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: discoveryKubeconfig},
				Items: []corev1.KeyToPath{{Key: "kubeconfig", Path: "kubeconfig"}}}},
		}}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "kube-api", MountPath: kubeAPIDir, ReadOnly: true})
	return yaml.Marshal(&d)
}

// writeDiscoveryKubeconfig creates the ConfigMap of the replicas' kubeconfig: the API
// server's address, and the token and CA files beside it in the projected volume (relative
// paths are relative to the kubeconfig's directory).
func (m *Mesh) writeDiscoveryKubeconfig(ctx context.Context) error {
	kubeconfig := `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "` + m.Cluster.Server() + `", certificate-authority: ca.crt}
users:
- name: discovery
  user: {tokenFile: token}
contexts:
- name: local
  context: {cluster: local, user: discovery}
current-context: local
`
	_, err := m.Cluster.Client.CoreV1().ConfigMaps(DiscoveryNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: discoveryKubeconfig},
		Data:       map[string]string{"kubeconfig": kubeconfig},
	}, metav1.CreateOptions{})
	return err
}

// DiscoveryPods are discovery's pods, by name.
func (m *Mesh) DiscoveryPods(ctx context.Context) ([]corev1.Pod, error) {
	return m.pods(ctx, DiscoveryNamespace, labels.Set{"app": "istiod"})
}

// waitDiscovery waits until the Deployment's replicas are all ready and the service proxy
// has them as endpoints.
func (m *Mesh) waitDiscovery(ctx context.Context) error {
	return m.waitFor(ctx, 3*time.Minute, "discovery's replicas to be ready", func() error {
		if err := m.rolledOut(ctx, DiscoveryNamespace, DiscoveryDeployment); err != nil {
			return err
		}
		pods, err := m.DiscoveryPods(ctx)
		if err != nil {
			return err
		}
		if n := len(m.XDS.Ready()); n != len(pods) {
			return fmt.Errorf("the service proxy has %d ready endpoints for %d pods", n, len(pods))
		}
		return nil
	}, DiscoveryNamespace)
}

// editConfigMap decodes a ConfigMap manifest, lets edit change the YAML document under key,
// and encodes it again.
func editConfigMap(data []byte, key string, edit func(doc map[string]any)) ([]byte, error) {
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		return nil, err
	}
	doc := map[string]any{}
	if err := yaml.Unmarshal([]byte(cm.Data[key]), &doc); err != nil {
		return nil, fmt.Errorf("key %s: %w", key, err)
	}
	edit(doc)
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	cm.Data[key] = string(out)
	return yaml.Marshal(&cm)
}

// child is doc[key] as an object, made when missing.
func child(doc map[string]any, key string) map[string]any {
	c, ok := doc[key].(map[string]any)
	if !ok {
		c = map[string]any{}
		doc[key] = c
	}
	return c
}

// localMeshConfig is the manifests' mesh config with the proxies' defaults for this machine:
// discovery through the service proxy (TLS, port 15012 of a replica), no traffic capture
// (pods have their own loopback addresses, docs/contracts.md), two worker threads. The
// injection mounts the CA token and the mesh root where Istio does; a process of this
// machine has no mount namespace, so the agent is told those paths (CA_ROOT_CA,
// WASMESH_CA_TOKEN_FILE) in the proxies' environment, where the node rewrites them to the
// pod's volumes: its defaults are a path relative to the container's root and one the
// node cannot rewrite (a built-in absolute path).
func (m *Mesh) localMeshConfig(data []byte) ([]byte, error) {
	return editConfigMap(data, "mesh", func(doc map[string]any) {
		pc := child(doc, "defaultConfig")
		pc["discoveryAddress"] = m.XDS.Addr()
		md := child(pc, "proxyMetadata")
		md["CA_ROOT_CA"] = inject.MeshRootDir + "/root-cert.pem"
		md[sidecar.TokenFileEnv] = inject.TokenDir + "/" + inject.TokenFile
		pc["interceptionMode"] = "NONE"
		pc["concurrency"] = 2
	})
}

// localInjectorValues is the manifests' injector values with what sidecars that are
// processes of this machine need: the agent runs meshproxy from the binary directory (an
// image's Envoy is not here), probes every second, small resource requests (one node holds
// every pod), a preStop sleep as long as the sample's drain, and the CA's address: the
// service proxy (istiod's Service name does not resolve here).
func (m *Mesh) localInjectorValues(data []byte) ([]byte, error) {
	return editConfigMap(data, "values", func(doc map[string]any) {
		g := child(doc, "global")
		g["caAddress"] = m.XDS.Addr()
		px := child(g, "proxy")
		px["binaryPath"] = filepath.Join(m.opts.BinDir, "meshproxy")
		px["readinessPeriodSeconds"] = 1
		px["preStopSleepSeconds"] = int(defaultDrain.Seconds())
		px["resources"] = map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "32Mi"}}
	})
}
