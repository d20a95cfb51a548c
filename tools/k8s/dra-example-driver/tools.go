//go:build tools

// Package tools pins Kubernetes' example DRA driver: the benchmarks' second driver, whose claims cost
// what DRA itself costs (kubelet prepares them, the driver writes a CDI spec and nothing else), so that
// make bench can tell DRA's share of a pod start from netclaim's.
package tools

import _ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
