package kubemesh

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/testenv/internal/httpget"
)

// Replica is one discovery pod as its debug server tells it.
type Replica struct {
	Pod, IP string
	// Ready is the pod's readiness; Restarts its discovery container's restart count.
	Ready    bool
	Restarts int32
	// Leader is what /debug/leader says (empty while the replica does not answer).
	Leader leader.Status
	// Proxies are the ids of the proxies with an xDS stream to it (/debug/syncz), sorted.
	Proxies []string
}

// DebugURL is a URL on the replica's debug server (its pod IP, port 15014).
func (r Replica) DebugURL(path string) string {
	return "http://" + net.JoinHostPort(r.IP, "15014") + path
}

// Replicas are discovery's pods and what each says of itself; a replica that does not
// answer has no leader status and no proxies.
func (m *Mesh) Replicas(ctx context.Context) ([]Replica, error) {
	pods, err := m.DiscoveryPods(ctx)
	if err != nil {
		return nil, err
	}
	var out []Replica
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		r := Replica{Pod: p.Name, IP: p.Status.PodIP, Ready: podReady(&p)}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "discovery" {
				r.Restarts = c.RestartCount
			}
		}
		var conns []struct {
			Proxy string `json:"proxy"`
		}
		if debugJSON(ctx, r.DebugURL("/debug/syncz"), &conns) == nil {
			for _, c := range conns {
				r.Proxies = append(r.Proxies, c.Proxy)
			}
			sort.Strings(r.Proxies)
		}
		_ = debugJSON(ctx, r.DebugURL("/debug/leader"), &r.Leader)
		out = append(out, r)
	}
	return out, nil
}

func debugJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b, err := httpget.Get(ctx, url)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// KillDiscovery kills the discovery container of the pod with SIGKILL, as a crash or an
// out-of-memory kill would: it releases nothing (its Lease runs out), and the node
// restarts the container.
func (m *Mesh) KillDiscovery(ctx context.Context, pod string) error {
	p, err := m.Cluster.Client.CoreV1().Pods(DiscoveryNamespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pid, err := containerPid(p, "discovery")
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kubemesh: killing discovery of pod %s (pid %d): %w", pod, pid, err)
	}
	return nil
}

// containerPid is the process of a running container, from its kubenode://<pid> ID.
func containerPid(p *corev1.Pod, container string) (int, error) {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name != container {
			continue
		}
		if c.State.Running == nil {
			return 0, fmt.Errorf("kubemesh: container %s of pod %s is not running", container, p.Name)
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(c.ContainerID, "kubenode://"))
		if err != nil {
			return 0, fmt.Errorf("kubemesh: container %s of pod %s: ID %q names no process", container, p.Name, c.ContainerID)
		}
		return pid, nil
	}
	return 0, fmt.Errorf("kubemesh: pod %s has no container %s", p.Name, container)
}
