package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
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

// set reports whether a kubeconfig or a context was given: a pod's admin is then reached
// through the API server (a port-forward) rather than found from discovery.
func (f *kubeFlags) set() bool { return f.kubeconfig != "" || f.context != "" }

// podRef reads <name>[.<namespace>]; without a namespace, --namespace (or the context's).
func (f *kubeFlags) podRef(arg string) (name, ns string, err error) {
	if name, ns, ok := strings.Cut(arg, "."); ok {
		return name, ns, nil
	}
	ns, err = f.ns()
	return arg, ns, err
}

// forward opens a port-forward to port of the pod arg names, as kubectl port-forward and
// istioctl do (client-go's portforward over SPDY, through the API server and the pod's
// kubelet), on a free port of 127.0.0.1. It returns the local address and how to close it.
func (f *kubeFlags) forward(ctx context.Context, arg string, port int) (string, func(), error) {
	name, ns, err := f.podRef(arg)
	if err != nil {
		return "", nil, err
	}
	cfg, err := f.restConfig()
	if err != nil {
		return "", nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", nil, err
	}
	pod, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return "", nil, fmt.Errorf("pod %s/%s is %s, not Running: no port-forward to it", ns, name, pod.Status.Phase)
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", nil, err
	}
	url := kc.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut strings.Builder
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		return "", nil, fmt.Errorf("port-forward to pod %s/%s port %d: %w %s", ns, name, port, err, errOut.String())
	case <-ctx.Done():
		close(stop)
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stop)
		return "", nil, fmt.Errorf("port-forward to pod %s/%s port %d: no local port (%v)", ns, name, port, err)
	}
	closer := func() {
		close(stop)
		<-done
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), closer, nil
}
