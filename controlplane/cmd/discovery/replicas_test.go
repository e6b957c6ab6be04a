package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
	"github.com/wasmesh/wasmesh/controlplane/webhook/webhooktest"
)

// The lease of the test: a dead leader is replaced within about 4 s (renewed every second).
const testLease = 4 * time.Second

// process is one discovery replica run as the real binary.
type process struct {
	name          string
	cmd           *exec.Cmd
	http, webhook string
	log           *syncBuffer
	exited        chan struct{}
}

func startProcess(t *testing.T, bin string, c *kubecluster.Cluster, name string) *process {
	t.Helper()
	p := &process{name: name, http: freePort(t), webhook: freePort(t), log: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "--kubeconfig", c.Kubeconfig, "--grpcAddr", freePort(t), "--httpAddr", p.http,
		"--webhookAddr", p.webhook, "--secureGRPCAddr", freePort(t), "--webhookCertHosts", "127.0.0.1", "--leaseDuration", testLease.String(),
		"--wasmCacheDir", t.TempDir())
	p.cmd.Env = append(os.Environ(), "POD_NAME="+name, "POD_NAMESPACE="+webhooktest.Namespace)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.log.String())
		}
	})
	return p
}

// kill ends the process at once, as a node failure would: it releases nothing.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

func (p *process) leader() leader.Status {
	var st leader.Status
	resp, err := http.Get("http://" + p.http + "/debug/leader")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// leaderGauge is the process's leader_election_master_status sample ("" before it serves).
func (p *process) leaderGauge() string {
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "leader_election_master_status{") {
			return l
		}
	}
	return ""
}

// Two discovery processes on one API server share the CA Secret and the Lease: exactly one
// leads (it patches the webhook's caBundle and writes statuses); when it is killed, the
// other takes over within the lease and does both.
func TestReplicasElectOneLeaderAndTakeOverWhenItDies(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{}, "VirtualService")
	bin := binary(t)
	vs := webhooktest.Setup(t, c)
	a, b := startProcess(t, bin, c, "discovery-a"), startProcess(t, bin, c, "discovery-b")
	// The configuration calls a; the API server never needs to here (Ignore: a dies).
	_, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(),
		webhooktest.ValidatingConfig("https://"+a.webhook+webhook.ValidatePath, admissionregistrationv1.Ignore), metav1.CreateOptions{})
	require.NoError(t, err)

	var lead, follower *process
	require.Eventually(t, func() bool {
		sa, sb := a.leader(), b.leader()
		switch {
		case sa.Leading && !sb.Leading && sb.Leader == a.name:
			lead, follower = a, b
		case sb.Leading && !sa.Leading && sa.Leader == b.name:
			lead, follower = b, a
		default:
			return false
		}
		return true
	}, time.Minute, 20*time.Millisecond, "one leads, the other observes it")
	assert.Equal(t, lead.name, webhooktest.LeaseHolder(t, c, leader.DefaultLeaseName))
	assert.Equal(t, `leader_election_master_status{name="`+leader.DefaultLeaseName+`"} 1`, lead.leaderGauge())
	assert.Equal(t, `leader_election_master_status{name="`+leader.DefaultLeaseName+`"} 0`, follower.leaderGauge())
	webhooktest.WaitCABundlePatched(t, c, "the leader patches in the shared CA")
	webhooktest.OneCASecret(t, c)
	for _, p := range []*process{a, b} {
		webhooktest.ServesCertTrustedBy(t, p.webhook, webhooktest.CABundle(t, c))
	}
	webhooktest.WaitStatusWritten(t, vs, "the leader writes the status of a rejected object")

	lead.kill()
	killed := time.Now()
	// The lease runs out at most a lease after the kill (it was renewed before), and the
	// follower tries every retry period (a quarter of the lease, jittered by up to 120%): it
	// leads within the lease and 2.2 retry periods, here 6.2 s; 2 s more for a loaded machine.
	require.Eventually(t, func() bool { return follower.leader().Leading }, testLease+testLease*11/20+2*time.Second, 10*time.Millisecond,
		"the follower takes over once the lease runs out")
	t.Logf("%s took over %v after %s was killed (lease %v)", follower.name, time.Since(killed).Round(time.Millisecond), lead.name, testLease)
	assert.Equal(t, follower.name, webhooktest.LeaseHolder(t, c, leader.DefaultLeaseName))
	webhooktest.OverwriteCABundle(t, c, "the new leader restores the caBundle")
	webhooktest.WipeStatus(t, vs, "the new leader writes the status")
	webhooktest.OneCASecret(t, c)
}
