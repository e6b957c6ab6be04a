package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// podWithStatus is the pod as the node last saw it, with the status its containers give.
func (r *podRun) podWithStatus() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pod.DeepCopy()
	p.Status = r.statusLocked()
	return p
}

func (r *podRun) statusLocked() corev1.PodStatus {
	st := corev1.PodStatus{
		Phase:     r.phaseLocked(),
		HostIP:    r.node.hostIP,
		HostIPs:   []corev1.HostIP{{IP: r.node.hostIP}},
		PodIP:     r.ip,
		PodIPs:    []corev1.PodIP{{IP: r.ip}},
		StartTime: &r.startTime,
		QOSClass:  r.pod.Status.QOSClass,
	}
	for _, c := range r.inits {
		st.InitContainerStatuses = append(st.InitContainerStatuses, c.statusLocked(r.volumeError))
	}
	for _, c := range r.regulars {
		st.ContainerStatuses = append(st.ContainerStatuses, c.statusLocked(r.volumeError))
	}
	for _, cond := range r.pod.Status.Conditions {
		if !ownedCondition(cond.Type) {
			st.Conditions = append(st.Conditions, cond)
		}
	}
	st.Conditions = append(st.Conditions, r.conditionsLocked()...)
	return st
}

func ownedCondition(t corev1.PodConditionType) bool {
	switch t {
	case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady:
		return true
	}
	return false
}

func (r *podRun) phaseLocked() corev1.PodPhase {
	if r.phase != "" {
		return r.phase
	}
	if !r.initDone {
		return corev1.PodPending
	}
	for _, c := range r.regulars {
		if !c.ran && c.lastTerm == nil {
			return corev1.PodPending
		}
	}
	return corev1.PodRunning
}

// statusLocked is the container's status; a container that never ran while the pod's
// volumes cannot be made says why in its waiting state.
func (c *container) statusLocked(volumeError string) corev1.ContainerStatus {
	started := c.started
	cs := corev1.ContainerStatus{Name: c.spec.Name, Image: c.spec.Image, ImageID: c.imageID,
		State: *c.state.DeepCopy(), LastTerminationState: *c.last.DeepCopy(),
		Ready: c.ready, RestartCount: c.restarts, Started: &started}
	if w := cs.State.Waiting; w != nil && volumeError != "" && c.runs == 0 {
		w.Message = volumeError
	}
	if c.proc != nil {
		cs.ContainerID = "kubenode://" + strconv.Itoa(c.proc.pid)
	}
	if c.kind == initContainer && c.state.Terminated != nil && c.state.Terminated.ExitCode == 0 {
		cs.Ready = true // a completed init container
	}
	return cs
}

// conditionsLocked are the conditions the node owns, as the kubelet sets them.
func (r *podRun) conditionsLocked() []corev1.PodCondition {
	var unready, uninitialized []string
	for _, c := range r.inits {
		switch {
		case c.kind == sidecarContainer && !c.ready:
			unready = append(unready, c.spec.Name)
			if !c.started && !r.initDone {
				uninitialized = append(uninitialized, c.spec.Name)
			}
		case c.kind == initContainer && !r.initDone && (c.state.Terminated == nil || c.state.Terminated.ExitCode != 0):
			uninitialized = append(uninitialized, c.spec.Name)
		}
	}
	for _, c := range r.regulars {
		if !c.ready {
			unready = append(unready, c.spec.Name)
		}
	}
	ended := r.phase != ""
	var conds []corev1.PodCondition
	add := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		status := corev1.ConditionFalse
		if ok {
			status, reason, msg = corev1.ConditionTrue, "", ""
		}
		if r.condition[t] != status {
			r.condition[t], r.conditionTime[t] = status, metav1.Now()
		}
		conds = append(conds, corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg,
			LastTransitionTime: r.conditionTime[t]})
	}
	notReady := func() (string, string) {
		if ended {
			return "PodCompleted", ""
		}
		return "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	add(corev1.PodReadyToStartContainers, r.volumesReady && !ended, "", "")
	add(corev1.PodInitialized, r.initDone, "ContainersNotInitialized",
		fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(uninitialized, " ")))
	reason, msg := notReady()
	add(corev1.ContainersReady, len(unready) == 0 && r.initDone && !ended, reason, msg)
	add(corev1.PodReady, len(unready) == 0 && r.initDone && !ended, reason, msg)
	return conds
}

// patchPodStatus writes the node's part of pod's status into the API server's pod, as the
// kubelet does: a strategic-merge patch of the status subresource from what the server has
// to what the node says, with the pod's UID as a precondition, so that the rest of the
// pod (its metadata, other writers' conditions) is left alone.
func patchPodStatus(ctx context.Context, pods corev1client.PodInterface, pod *corev1.Pod) error {
	cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cur.UID != pod.UID {
		return nil
	}
	want := cur.Status.DeepCopy()
	mergeStatus(want, &pod.Status)
	if equality.Semantic.DeepEqual(&cur.Status, want) {
		return nil
	}
	before, err := json.Marshal(corev1.Pod{Status: cur.Status})
	if err != nil {
		return err
	}
	after, err := json.Marshal(corev1.Pod{Status: *want})
	if err != nil {
		return err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(before, after, corev1.Pod{})
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return err
	}
	m["metadata"] = map[string]any{"uid": string(pod.UID)}
	if patch, err = json.Marshal(m); err != nil {
		return err
	}
	_, err = pods.Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// mergeStatus sets in dst what the node owns of a pod's status: phase, addresses, start
// time, container statuses and its conditions (others' conditions stay).
func mergeStatus(dst, src *corev1.PodStatus) {
	dst.Phase, dst.Reason, dst.Message = src.Phase, src.Reason, src.Message
	dst.HostIP, dst.HostIPs, dst.PodIP, dst.PodIPs = src.HostIP, src.HostIPs, src.PodIP, src.PodIPs
	dst.StartTime = src.StartTime
	dst.InitContainerStatuses, dst.ContainerStatuses = src.InitContainerStatuses, src.ContainerStatuses
	for _, c := range src.Conditions {
		if !ownedCondition(c.Type) {
			continue
		}
		found := false
		for i := range dst.Conditions {
			if dst.Conditions[i].Type == c.Type {
				dst.Conditions[i], found = c, true
			}
		}
		if !found {
			dst.Conditions = append(dst.Conditions, c)
		}
	}
}

// podsClient is the pods client virtual-kubelet's pod controller gets. UpdateStatus
// patches the node's part of the status (patchPodStatus) instead of replacing the pod's
// status and metadata with the provider's copy, which could undo a label change made
// meanwhile. Delete, which the controller calls to force-delete a pod whose grace period
// is over (or at once, for a pod whose containers all wait), leaves a pod the node still
// runs to the node, which terminates it and deletes it once its containers are down, as
// the kubelet does: so the pod stays in the API server while its preStop hooks and
// SIGTERM run, and its final status is written before it goes.
type podsClient struct {
	corev1client.PodsGetter
	n *Node
}

func (s podsClient) Pods(ns string) corev1client.PodInterface {
	return nodePods{PodInterface: s.PodsGetter.Pods(ns), n: s.n, ns: ns}
}

type nodePods struct {
	corev1client.PodInterface
	n  *Node
	ns string
}

func (p nodePods) UpdateStatus(ctx context.Context, pod *corev1.Pod, _ metav1.UpdateOptions) (*corev1.Pod, error) {
	return pod, patchPodStatus(ctx, p.PodInterface, pod)
}

func (p nodePods) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	r, err := provider{p.n}.get(p.ns, name)
	if err != nil || (opts.Preconditions != nil && opts.Preconditions.UID != nil && *opts.Preconditions.UID != r.uid) {
		return p.PodInterface.Delete(ctx, name, opts)
	}
	var deleted *corev1.Pod
	if cur, err := p.PodInterface.Get(ctx, name, metav1.GetOptions{}); err == nil && cur.UID == r.uid {
		deleted = cur
	}
	r.terminate(r.gracePeriod(deleted))
	return nil
}
