package kubenode_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

// envChildNode makes the test binary a node of the cluster whose admin kubeconfig it
// names, in the directory envChildDir names, and nothing else: the test of what happens
// when a node dies outright kills that process.
const (
	envChildNode = "KUBENODE_TEST_CHILD_NODE"
	envChildDir  = "KUBENODE_TEST_CHILD_DIR"
	childName    = "doomed"
)

func runChildNode(kubeconfig string) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err == nil {
		_, err = kubenode.Start(context.Background(), kubenode.Options{Config: cfg, Name: childName, Dir: os.Getenv(envChildDir)})
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

// A node killed outright (SIGKILL, no Close) takes its containers with it: each has a
// parent-death SIGKILL.
func testNodeDeath(e *env) {
	t := e.t
	dir := t.TempDir()
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildNode+"="+e.cluster.Kubeconfig, envChildDir+"="+dir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	defer func() { // no pod is scheduled to a dead node
		_ = e.kc.CoreV1().Nodes().Delete(e.ctx, childName, metav1.DeleteOptions{})
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready", strings.TrimSpace(line))

	e.createPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orphan"}, Spec: corev1.PodSpec{NodeName: childName,
		Containers: []corev1.Container{shell("main", "exec sleep 3600")}}})
	p := e.waitPod("orphan", time.Minute, "running", running)
	container := pid(t, p, "main")
	require.True(t, alive(container))
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	e.waitFor(time.Minute, "the container to die with its node", func() error {
		if alive(container) {
			return fmt.Errorf("process %d of the dead node is alive", container)
		}
		return nil
	})
}

// alive reports whether pid runs (a zombie, dead but not yet reaped by whoever inherited
// it, does not).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
