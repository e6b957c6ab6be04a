package kubenode_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/testenv/kubenode"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// env is what a test on a real control plane has: the cluster (controller manager and
// scheduler, so Deployments, ReplicaSets and EndpointSlices are real), a node, and a
// namespace of its own.
type env struct {
	t       *testing.T
	cluster *kubecluster.Cluster
	kc      kubernetes.Interface
	node    *kubenode.Node
	ns      string
	ctx     context.Context
}

// echoBinDir is a directory holding the echo binary: $WASMESH_BIN_DIR's, else one built
// from testenv/cmd/echo for the test.
func echoBinDir(t *testing.T) string {
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "echo")); err == nil {
			return dir
		}
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "echo"), "./cmd/echo")
	cmd.Dir = filepath.Join(meshtest.Root(), "testenv")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building echo: %s", out)
	return dir
}

// startNode starts a node on the cluster for the test, with short restart back-offs; when
// the test ends it is closed and must have left no process behind.
func startNode(t *testing.T, c *kubecluster.Cluster, opts kubenode.Options) *kubenode.Node {
	t.Helper()
	opts.Config = c.Config
	if opts.RestartBackoff == 0 {
		opts.RestartBackoff, opts.MaxRestartBackoff = 500*time.Millisecond, 4*time.Second
	}
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := kubenode.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		n.Close()
		require.Empty(t, n.Processes(), "processes of node %s left after Close", n.Name())
	})
	return n
}

// namespace makes a namespace for a subtest and waits for its default ServiceAccount
// (the controller manager makes it; pods cannot be admitted before).
func (e *env) namespace(t *testing.T, name string) *env {
	sub := *e
	sub.t, sub.ns = t, name
	_, err := e.kc.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	sub.waitFor(time.Minute, "the namespace's default ServiceAccount", func() error {
		_, err := e.kc.CoreV1().ServiceAccounts(name).Get(e.ctx, "default", metav1.GetOptions{})
		return err
	})
	return &sub
}

// waitFor polls check until it returns nil or the timeout passes.
func (e *env) waitFor(timeout time.Duration, what string, check func() error) {
	e.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-deadline.C:
			e.t.Fatalf("waiting for %s: %v", what, err)
		case <-tick.C:
		}
	}
}

func (e *env) createPod(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	pod.Namespace = e.ns
	created, err := e.kc.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{})
	require.NoError(e.t, err)
	return created
}

// waitPod waits until the pod satisfies cond (which says what it lacks).
func (e *env) waitPod(name string, timeout time.Duration, what string, cond func(*corev1.Pod) error) *corev1.Pod {
	e.t.Helper()
	var last *corev1.Pod
	e.waitFor(timeout, "pod "+name+" "+what, func() error {
		p, err := e.kc.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		last = p
		if err := cond(p); err != nil {
			return fmt.Errorf("%w\nstatus: %s", err, statusSummary(p))
		}
		return nil
	})
	return last
}

// waitGone waits until the pod is gone from the API server and no process of it is left.
func (e *env) waitGone(name string) {
	e.t.Helper()
	e.waitFor(time.Minute, "pod "+name+" to be gone with its processes", func() error {
		if _, err := e.kc.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("pod %s is still in the API server", name)
		}
		if pids := e.processesOf(name); len(pids) > 0 {
			return fmt.Errorf("processes of pod %s still running: %v", name, pids)
		}
		return nil
	})
}

func ready(p *corev1.Pod) error {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s is not Ready", p.Name)
}

func running(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s", p.Status.Phase)
	}
	return nil
}

func statusSummary(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s ip=%s", p.Status.Phase, p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s", c.Type, c.Status)
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			fmt.Fprintf(&b, "\n  %s ready=%v restarts=%d state=%s", cs.Name, cs.Ready, cs.RestartCount, stateString(cs.State))
		}
	}
	return b.String()
}

func stateString(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated(%d %s %s)", s.Terminated.ExitCode, s.Terminated.Reason, s.Terminated.Message)
	case s.Waiting != nil:
		return fmt.Sprintf("waiting(%s: %s)", s.Waiting.Reason, s.Waiting.Message)
	}
	return "none"
}

func containerStatus(p *corev1.Pod, name string) corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			if cs.Name == name {
				return cs
			}
		}
	}
	return corev1.ContainerStatus{}
}

// pid is the process of a running container (its container ID is kubenode://<pid>).
func pid(t *testing.T, p *corev1.Pod, container string) int {
	t.Helper()
	cs := containerStatus(p, container)
	n, err := strconv.Atoi(strings.TrimPrefix(cs.ContainerID, "kubenode://"))
	require.NoError(t, err, "container %s: ID %q", container, cs.ContainerID)
	return n
}

// environOf is a process's environment.
func environOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	require.NoError(t, err)
	env := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env
}

// processesOf lists the node's processes of a pod (the runtime gives every container,
// hook and probe HOSTNAME=<pod name>).
func (e *env) processesOf(pod string) []int {
	var out []int
	for _, p := range e.node.Processes() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p))
		if err == nil && (bytes.Contains(b, []byte("\x00HOSTNAME="+pod+"\x00")) || bytes.HasPrefix(b, []byte("HOSTNAME="+pod+"\x00"))) {
			out = append(out, p)
		}
	}
	return out
}

// commandOf is a process's command line.
func commandOf(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// lines reads a file of events the test's containers append to.
func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Fields(string(b))
}

// before asserts that a comes before b in the events.
func before(t *testing.T, events []string, a, b string) {
	t.Helper()
	ia, ib := index(events, a), index(events, b)
	require.NotEqual(t, -1, ia, "%s in %v", a, events)
	require.NotEqual(t, -1, ib, "%s in %v", b, events)
	require.Less(t, ia, ib, "%s before %s in %v", a, b, events)
}

func index(events []string, s string) int {
	for i, e := range events {
		if e == s {
			return i
		}
	}
	return -1
}

// shell is a busybox container running script with the machine's sh.
func shell(name, script string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox:1.36", Command: []string{"sh", "-c", script}}
}

func hostPathVolume(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

func int64p(v int64) *int64 { return &v }
