package kubenode

import (
	"context"
	"fmt"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
)

// provider is the node's virtual-kubelet PodLifecycleHandler and PodNotifier: the
// container runtime behind the pod controller.
type provider struct{ n *Node }

// CreatePod starts a pod: it gets its addresses and runs its start sequence in the
// background; its status follows through NotifyPods.
func (p provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	n := p.n
	key := pod.Namespace + "/" + pod.Name
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return n.ctx.Err()
	}
	if r, ok := n.pods[key]; ok {
		if r.uid == pod.UID {
			return nil
		}
		// A pod of the same name is still terminating: the new one waits for it (the pod
		// controller retries).
		return fmt.Errorf("kubenode: pod %s (uid %s) waits for its predecessor (uid %s) to terminate", key, pod.UID, r.uid)
	}
	n.seq++
	r := newPodRun(n, pod, n.seq)
	n.pods[key] = r
	n.all = append(n.all, r)
	go r.reporter()
	go r.run()
	n.logf("pod %s: pod IP %s, localhost %s", key, r.ip, r.localhost)
	return nil
}

// UpdatePod takes the pod's new labels and annotations (its downward-API files follow);
// what else a pod update may change (an image) is not applied to running containers.
func (p provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	r, err := p.get(pod.Namespace, pod.Name)
	if err != nil {
		return err
	}
	if r.uid != pod.UID {
		return p.CreatePod(ctx, pod)
	}
	r.update(pod)
	return nil
}

// DeletePod terminates the pod in the background, with the deletion's grace period.
func (p provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	r, err := p.get(pod.Namespace, pod.Name)
	if err != nil {
		return err
	}
	if pod.UID != "" && r.uid != pod.UID {
		return nil
	}
	r.terminate(r.gracePeriod(pod))
	return nil
}

func (p provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r, err := p.get(namespace, name)
	if err != nil {
		return nil, err
	}
	return r.podWithStatus(), nil
}

func (p provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.n.mu.Lock()
	runs := make([]*podRun, 0, len(p.n.pods))
	for _, r := range p.n.pods {
		runs = append(runs, r)
	}
	p.n.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(runs))
	for _, r := range runs {
		pods = append(pods, r.podWithStatus())
	}
	return pods, nil
}

func (p provider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	p.n.notify = notify
}

func (p provider) get(namespace, name string) (*podRun, error) {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	r, ok := p.n.pods[namespace+"/"+name]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.n.opts.Name)
	}
	return r, nil
}
