package kube

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// servedKinds asks the API server's discovery which of kinds it serves (their CRD is
// installed and established). An error means discovery itself failed (the API server is
// away, or refuses): the caller retries.
func servedKinds(dc discovery.DiscoveryInterface, kinds []*istioKind) (served, missing []*istioKind, err error) {
	resources := map[string][]string{} // by group/version
	for _, k := range kinds {
		gv := k.apiVersion()
		if _, done := resources[gv]; done {
			continue
		}
		list, err := dc.ServerResourcesForGroupVersion(gv)
		switch {
		case apierrors.IsNotFound(err):
			resources[gv] = []string{}
		case err != nil:
			return nil, nil, fmt.Errorf("discovering %s: %w", gv, err)
		default:
			names := []string{}
			for _, r := range list.APIResources {
				names = append(names, r.Name)
			}
			resources[gv] = names
		}
	}
	for _, k := range kinds {
		if slices.Contains(resources[k.apiVersion()], k.resource) {
			served = append(served, k)
		} else {
			missing = append(missing, k)
		}
	}
	return served, missing, nil
}

// watchCRDs queues the CustomResourceDefinitions named in missing whenever one is added
// or changes (it becomes established), so that a kind whose CRD is installed later is
// watched from then on. No polling: a metadata informer on CRDs, which needs list and
// watch on them; without those, missing kinds stay unwatched (the error is logged).
func (s *Source) watchCRDs(ctx context.Context, missing map[string]*istioKind) {
	f := metadatainformer.NewSharedInformerFactory(s.meta, 0)
	inf := f.ForResource(crdResource).Informer()
	_ = inf.SetWatchErrorHandlerWithContext(s.watchErrorHandler(crdResource.GroupResource().String()))
	queue := func(o any) {
		if m, err := metaOf(o); err == nil && missing[m.GetName()] != nil {
			s.q.add(ref{res: resCRD, name: m.GetName()})
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: queue, UpdateFunc: func(_, o any) { queue(o) }})
	f.Start(ctx.Done())
	s.shutdown = append(s.shutdown, f.Shutdown)
}
