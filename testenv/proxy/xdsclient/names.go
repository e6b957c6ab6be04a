package xdsclient

import (
	"fmt"

	"google.golang.org/protobuf/types/known/anypb"
)

// named is any xDS resource with a name (ClusterLoadAssignment has cluster_name instead).
type named interface{ GetName() string }

type clusterNamed interface{ GetClusterName() string }

// ResourceName decodes a resource and returns its name.
func ResourceName(a *anypb.Any) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", fmt.Errorf("decode %s: %w", a.GetTypeUrl(), err)
	}
	switch v := m.(type) {
	case clusterNamed:
		return v.GetClusterName(), nil
	case named:
		return v.GetName(), nil
	}
	return "", fmt.Errorf("resource of type %s has no name", a.GetTypeUrl())
}
