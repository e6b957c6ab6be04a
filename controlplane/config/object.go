package config

import (
	"encoding/json"
	"time"
)

// Object is a config as a Kubernetes API server serves it: the envelope's kind, apiVersion
// and metadata, and the spec as JSON.
type Object struct {
	Kind        string
	APIVersion  string // "networking.istio.io/v1"
	Name        string
	Namespace   string
	Labels      map[string]string
	Annotations map[string]string
	Created     time.Time // metadata.creationTimestamp
	Spec        json.RawMessage
}

// FromObject builds the config of obj through the same kind table, spec decoding and
// validation as ParseFile, so an object in a cluster and the same document in a file are
// accepted or rejected alike. source names the object in Meta.Source and in the error
// (an Error with Doc 0, its File the source).
func FromObject(source string, obj Object) (*Config, *Error) {
	h := header{APIVersion: obj.APIVersion, Kind: obj.Kind, Spec: obj.Spec, Metadata: metadata{
		Name: obj.Name, Namespace: obj.Namespace, Labels: obj.Labels, Annotations: obj.Annotations,
	}}
	c, field, err := configOf(h, source)
	if err != nil {
		ns := obj.Namespace
		if ns == "" {
			ns = DefaultNamespace
		}
		e := &Error{File: source, Field: field, Err: err}
		if obj.Kind != "" && obj.Name != "" {
			e.Key = &Key{Kind: Kind(obj.Kind), Namespace: ns, Name: obj.Name}
		}
		return nil, e
	}
	c.Created = obj.Created
	return c, nil
}
