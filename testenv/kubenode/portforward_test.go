package kubenode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/testenv/echo"
	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

// A port-forward as kubectl's and istioctl's (client-go over SPDY) goes through the real
// API server to the node's kubelet API, and the node dials the pod: a port on the pod's
// private localhost (where a sidecar's admin listens) and one on its pod IP both answer,
// each by its own process; a port nothing listens on fails the forwarded connection.
func TestPortForwardThroughTheAPIServer(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	opts := kubenode.Options{BinDir: echoBinDir(t)}
	if inNetns() {
		opts.PodNet = "198.18" // see TestMain
	}
	n := startNode(t, c, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := &env{t: t, cluster: c, kc: c.Client, node: n, ctx: ctx, ns: "forward"}
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	container := func(name, listen string) corev1.Container {
		return corev1.Container{Name: name, Image: "wasmesh/echo", Args: []string{"--listen=" + listen, "--service=" + name, "--pod=web"}}
	}
	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{NodeName: n.Name(), AutomountServiceAccountToken: new(false),
		Containers: []corev1.Container{container("admin", "$(WASMESH_LOCALHOST):15000"), container("app", "$(WASMESH_WILDCARD):8080")}}})
	e.waitPod("web", time.Minute, "running", running)

	local := forward(t, c.Config, e.ns, "web", 15000, 8080, 15001)
	for port, service := range map[int]string{15000: "admin", 8080: "app"} {
		var answer echo.Answer
		e.waitFor(30*time.Second, fmt.Sprintf("an answer through the port-forward to port %d", port), func() error {
			body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/", local[port]))
			if err != nil {
				return err
			}
			return json.Unmarshal(body, &answer)
		})
		assert.Equal(t, service, answer.Service, "port %d is the pod's %s process", port, service)
		assert.Equal(t, "web", answer.Pod)
	}
	_, err = httpGet(fmt.Sprintf("http://127.0.0.1:%d/", local[15001]))
	require.Error(t, err, "nothing listens on the pod's port 15001")
}

// forward opens a client-go port-forward to the pod's ports until the test ends and returns
// the local port of each.
func forward(t *testing.T, cfg *rest.Config, ns, pod string, ports ...int) map[int]int {
	t.Helper()
	kc, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	require.NoError(t, err)
	url := kc.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	var specs []string
	for _, p := range ports {
		specs = append(specs, "0:"+strconv.Itoa(p))
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, specs, stop, ready, io.Discard, io.Discard)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	t.Cleanup(func() {
		close(stop)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the port-forward did not stop within 10 s")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("port-forward not ready in 30 s")
	}
	got, err := fw.GetPorts()
	require.NoError(t, err)
	out := map[int]int{}
	for _, p := range got {
		out[int(p.Remote)] = int(p.Local)
	}
	return out
}

func httpGet(url string) ([]byte, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, err
}
