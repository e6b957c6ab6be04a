package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeFlags are how meshctl reaches a Kubernetes cluster, kubectl's and istioctl's flags.
type kubeFlags struct {
	kubeconfig, context, namespace string
}

func (f *kubeFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	fl.StringVar(&f.context, "context", "", "the kubeconfig context to use (default: its current context)")
	fl.StringVarP(&f.namespace, "namespace", "n", "", "the namespace (default: the context's, else default)")
}

func (f *kubeFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
}

// restConfig reaches the API server the kubeconfig and context name.
func (f *kubeFlags) restConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// ns is --namespace, else the context's namespace, else default.
func (f *kubeFlags) ns() (string, error) {
	if f.namespace != "" {
		return f.namespace, nil
	}
	ns, _, err := f.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("kubeconfig: %w", err)
	}
	return ns, nil
}
