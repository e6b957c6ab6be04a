package discovery_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/discovery/discoverytest"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
	"github.com/wasmesh/wasmesh/controlplane/webhook/webhooktest"
)

// replica is one discovery on the cluster, running until it is stopped or the test ends.
type replica struct {
	d *discoverytest.Server
}

func startReplica(t *testing.T, c *kubecluster.Cluster, id string) *replica {
	t.Helper()
	return &replica{d: discoverytest.Run(t, discovery.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Server: server.Defaults(), ShutdownGrace: time.Second,
		Debounce: discoverytest.Debounce,
		Kube:     c.Config, KubeStatus: true, Namespace: webhooktest.Namespace, Identity: id, LeaderElection: true, LeaseDuration: 10 * time.Second,
		Webhook: discovery.WebhookOptions{Addr: "127.0.0.1:0", Hosts: []string{"127.0.0.1"}, ConfigName: webhook.DefaultValidatingConfig},
		CA:      discovery.CAOptions{SecureGRPCAddr: "127.0.0.1:0"},
	}, discoverytest.Log().With("replica", id))}
}

func (r *replica) leader(t *testing.T) leader.Status {
	t.Helper()
	var st leader.Status
	resp, err := http.Get("http://" + r.d.HTTPAddr() + "/debug/leader")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

// kubectl runs kubectl on the cluster with stdin, returning its combined output.
func kubectl(t *testing.T, c *kubecluster.Cluster, stdin string, args ...string) (string, error) {
	t.Helper()
	dir, err := kubecluster.BinDir()
	require.NoError(t, err)
	cmd := exec.Command(filepath.Join(dir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// discovery on a real API server, as replicas run in a cluster: its webhook refuses an
// invalid VirtualService at apply time with the message the Kubernetes source gives it; the
// leader keeps the caBundle of the webhook configuration and writes statuses; a second
// replica shares the CA and the Lease, and takes over when the leader stops.
func TestWebhookAndLeadershipOnKubernetes(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{}, "VirtualService")
	ctx := context.Background()
	vs := webhooktest.Setup(t, c)
	// A replica that went away holds the Lease for a while yet.
	now := metav1.NewMicroTime(time.Now())
	_, err := c.Client.CoordinationV1().Leases(webhooktest.Namespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: leader.DefaultLeaseName},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("gone"), LeaseDurationSeconds: ptr.To(int32(8)), AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	a := startReplica(t, c, "discovery-a")
	vwc, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
		webhooktest.ValidatingConfig("https://"+a.d.WebhookAddr()+webhook.ValidatePath, admissionregistrationv1.Fail), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Empty(t, vwc.Webhooks[0].ClientConfig.CABundle)

	t.Run("follower", func(t *testing.T) {
		// Until the Lease runs out a follows: it has read the broken object, but neither
		// writes its status nor patches the caBundle.
		require.Eventually(t, func() bool {
			return a.leader(t).Leader == "gone" && strings.Contains(httpGet(t, "http://"+a.d.HTTPAddr()+"/debug/configz"), `"status": "rejected"`)
		}, time.Minute, 20*time.Millisecond)
		assert.Never(t, func() bool {
			return webhooktest.StatusMessage(t, vs, "broken") != "" || len(webhooktest.CABundle(t, c)) > 0 || rootConfigMap(t, c, "demo") != ""
		}, time.Second, 50*time.Millisecond, "a follower does no singleton work")
		require.False(t, a.leader(t).Leading, "the Lease has not run out yet")
		require.Eventually(t, func() bool { return a.leader(t).Leading }, time.Minute, 20*time.Millisecond, "a leads once it runs out")
	})
	t.Run("caBundle", func(t *testing.T) {
		webhooktest.WaitCABundlePatched(t, c, "the leader patches in the shared CA")
		got, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwc.Name, metav1.GetOptions{})
		require.NoError(t, err)
		got.Webhooks[0].ClientConfig.CABundle = nil
		assert.Equal(t, vwc.Webhooks, got.Webhooks, "nothing but the caBundle changed")
		webhooktest.OverwriteCABundle(t, c, "a caBundle someone changed is restored")
		webhooktest.ServesCertTrustedBy(t, a.d.WebhookAddr(), webhooktest.CABundle(t, c))
	})
	t.Run("ca", func(t *testing.T) { checkCA(t, c, a) })
	t.Run("xdsAuth", func(t *testing.T) { checkXDSAuthKube(t, c, a) })
	t.Run("validation", func(t *testing.T) { checkValidation(t, c, vs) })
	t.Run("status", func(t *testing.T) {
		webhooktest.WaitStatusWritten(t, vs, "the leader writes the status of a rejected object")
		// The webhook says what the status says (an update, dry run: nothing is stored).
		cur, err := vs.Get(ctx, "broken", metav1.GetOptions{})
		require.NoError(t, err)
		_, err = vs.Update(ctx, cur, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), webhooktest.Denied+"configuration is invalid: "+webhooktest.StatusMessage(t, vs, "broken"))
	})
	t.Run("handover", func(t *testing.T) { checkHandover(t, c, vs, a) })
}

// checkValidation applies VirtualServices with kubectl through the API server, which calls
// the webhook.
func checkValidation(t *testing.T, c *kubecluster.Cluster, vs dynamic.ResourceInterface) {
	refused := func(name string) string {
		return webhooktest.Denied + "configuration is invalid: kubernetes: VirtualService demo/" + name + ": " + webhooktest.WeightField
	}
	bad, good := webhooktest.YAML(t, webhooktest.VirtualService("bad", -5)), webhooktest.YAML(t, webhooktest.VirtualService("good", 0))
	out, err := kubectl(t, c, bad, "apply", "-f", "-")
	require.Error(t, err, out)
	assert.Contains(t, out, refused("bad"))
	_, err = vs.Get(context.Background(), "bad", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the refused object is not stored")

	out, err = kubectl(t, c, bad, "apply", "--dry-run=server", "-f", "-")
	require.Error(t, err, out)
	assert.Contains(t, out, refused("bad"), "a dry run is judged alike")

	out, err = kubectl(t, c, good, "apply", "--dry-run=server", "-f", "-")
	require.NoError(t, err, out)
	_, err = vs.Get(context.Background(), "good", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "a dry run stores nothing")

	out, err = kubectl(t, c, good, "apply", "-f", "-")
	require.NoError(t, err, out)
	assert.Contains(t, out, "virtualservice.networking.istio.io/good created")
	// An update that breaks it is refused too; a delete is not judged.
	out, err = kubectl(t, c, webhooktest.YAML(t, webhooktest.VirtualService("good", -1)), "apply", "-f", "-")
	require.Error(t, err, out)
	assert.Contains(t, out, refused("good"))
	out, err = kubectl(t, c, "", "delete", "-n", "demo", "virtualservice", "good")
	require.NoError(t, err, out)
}

// checkHandover starts a second replica: it shares the CA Secret and the Lease, follows
// while a leads, and when a stops it leads: it keeps the caBundle and writes statuses.
func checkHandover(t *testing.T, c *kubecluster.Cluster, vs dynamic.ResourceInterface, a *replica) {
	b := startReplica(t, c, "discovery-b")
	require.Eventually(t, func() bool { return b.leader(t).Leader == "discovery-a" }, time.Minute, 20*time.Millisecond,
		"b observes a leading")
	assert.True(t, a.leader(t).Leading)
	assert.False(t, b.leader(t).Leading, "one leader")
	webhooktest.ServesCertTrustedBy(t, b.d.WebhookAddr(), webhooktest.CABundle(t, c))
	webhooktest.OneCASecret(t, c)

	a.d.Stop()
	require.Eventually(t, func() bool { return b.leader(t).Leading }, time.Minute, 20*time.Millisecond, "b leads once a stops")
	assert.Equal(t, "discovery-b", webhooktest.LeaseHolder(t, c, leader.DefaultLeaseName))
	webhooktest.OverwriteCABundle(t, c, "the new leader restores the caBundle")
	webhooktest.WipeStatus(t, vs, "the new leader writes the status")
}
