// Command etcd is etcd's server (go.etcd.io/etcd/server/v3/etcdmain) for the tests' and
// run-k8s's Kubernetes control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
