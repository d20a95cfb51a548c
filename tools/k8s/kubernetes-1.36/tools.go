//go:build tools

// Package tools pins the Kubernetes programs of the local cluster at 1.36 (make test-matrix).
// It is never compiled; `go build` of the listed commands uses these pins.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
