package kube

import (
	"context"
	"fmt"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// ListConfigs lists, once, the Istio objects of every kind the source reads whose CRD the
// API server serves (the others are skipped), in every namespace, and translates each as
// the source does: the valid ones as configs, the others as the errors the source would
// report (their Key set). For one-shot readers (meshctl analyze --kubernetes).
func ListConfigs(ctx context.Context, cfg *rest.Config) ([]*config.Config, []*config.Error, error) {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	ic, err := istioclient.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("Istio client for %s: %w", cfg.Host, err)
	}
	all := make([]*istioKind, len(istioKinds))
	for i := range istioKinds {
		all[i] = &istioKinds[i]
	}
	served, _, err := servedKinds(kc.Discovery(), all)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	f := istioinformers.NewSharedInformerFactory(ic, 0)
	defer func() {
		cancel() // the informers stop, then Shutdown waits for them
		f.Shutdown()
	}()
	for _, k := range served {
		k.informer(f)
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, nil, fmt.Errorf("listing %v from %s: %w", typ, cfg.Host, context.Cause(ctx))
		}
	}
	var cfgs []*config.Config
	var rejected []*config.Error
	for _, k := range served {
		for _, obj := range k.informer(f).GetStore().List() {
			meta, spec, _ := k.object(obj)
			key := config.Key{Kind: k.kind, Namespace: meta.GetNamespace(), Name: meta.GetName()}
			c, cerr := translate(k, key, meta, spec)
			if cerr != nil {
				rejected = append(rejected, cerr)
				continue
			}
			cfgs = append(cfgs, c)
		}
	}
	return cfgs, rejected, nil
}
