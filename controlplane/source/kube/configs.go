package kube

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// Statuses of an Istio object, as the directory source words them.
const (
	StatusApplied      = "applied"
	StatusRejected     = "rejected"
	StatusRejectedKept = "rejected (last good kept)"
	objectSourcePrefix = "kubernetes: "
)

// ObjectStatus is the outcome of the latest version of one Istio object, for the debug
// page: applied, or rejected (with the last good version kept when there is one) and why.
type ObjectStatus struct {
	Kind      config.Kind `json:"kind"`
	Namespace string      `json:"namespace"`
	Name      string      `json:"name"`
	Status    string      `json:"status"`
	Error     string      `json:"error,omitempty"`
}

// configs is what the source holds in force of Istio's custom resources: the configs it
// published (the last good version of a rejected object stays) and each object's status.
type configs struct {
	log     *slog.Logger
	inForce map[config.Key]*config.Config // owned by the worker

	mu     sync.RWMutex
	status map[config.Key]ObjectStatus
}

func newConfigs(log *slog.Logger) *configs {
	return &configs{log: log, inForce: map[config.Key]*config.Config{}, status: map[config.Key]ObjectStatus{}}
}

// objectSource names an object in Meta.Source and errors: "kubernetes: VirtualService ns/name".
func objectSource(k config.Key) string {
	return objectSourcePrefix + string(k.Kind) + " " + k.Namespace + "/" + k.Name
}

// update translates the object of kind at key (nil: it is gone) and records in b what
// changes in force. A rejected object leaves its last good version in force. The outcome
// is returned for the status writer (nil error: applied).
func (c *configs) update(k *istioKind, key config.Key, obj any, b *batch) *config.Error {
	if obj == nil {
		if _, ok := c.inForce[key]; ok {
			delete(c.inForce, key)
			b.configs.Deleted = append(b.configs.Deleted, key)
		}
		c.mu.Lock()
		delete(c.status, key)
		c.mu.Unlock()
		return nil
	}
	meta, spec, _ := k.object(obj)
	cfg, cerr := translate(k, key, meta, spec)
	st := ObjectStatus{Kind: key.Kind, Namespace: key.Namespace, Name: key.Name, Status: StatusApplied}
	if cerr != nil {
		st.Status, st.Error = StatusRejected, cerr.Error()
		if c.inForce[key] != nil {
			st.Status = StatusRejectedKept
		}
	} else if old := c.inForce[key]; old == nil || !old.Equal(cfg) {
		c.inForce[key] = cfg
		b.configs.Updated = append(b.configs.Updated, cfg)
	}
	c.mu.Lock()
	prev := c.status[key]
	c.status[key] = st
	c.mu.Unlock()
	if cerr != nil && prev.Error != st.Error {
		c.log.Warn("Istio config rejected", "config", key.String(), "status", st.Status, "error", cerr.Error())
	}
	return cerr
}

// translate is the object through config.FromObject, the directory's parser and validator:
// its spec as JSON, as an API server serves it.
func translate(k *istioKind, key config.Key, meta metav1.Object, spec proto.Message) (*config.Config, *config.Error) {
	js, err := protojson.Marshal(spec)
	if err != nil {
		return nil, &config.Error{File: objectSource(key), Key: &key, Field: "spec", Err: fmt.Errorf("encoding spec: %w", err)}
	}
	return config.FromObject(objectSource(key), config.Object{
		Kind: string(k.kind), APIVersion: k.apiVersion(), Name: key.Name, Namespace: key.Namespace,
		Labels: meta.GetLabels(), Annotations: meta.GetAnnotations(), Created: meta.GetCreationTimestamp().Time, Spec: js,
	})
}

// Status lists the latest outcome of every Istio object the source sees, by kind,
// namespace and name.
func (c *configs) list() []ObjectStatus {
	c.mu.RLock()
	out := make([]ObjectStatus, 0, len(c.status))
	for _, st := range c.status {
		out = append(out, st)
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b ObjectStatus) int {
		return config.CompareKeys(config.Key{Kind: a.Kind, Namespace: a.Namespace, Name: a.Name},
			config.Key{Kind: b.Kind, Namespace: b.Namespace, Name: b.Name})
	})
	return out
}
