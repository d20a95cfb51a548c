//go:build tools

// Package tools pins containerd 1.7 (the last 1.x line; NRI off by default, enabled in its version-2
// config; make test-matrix, paired with Kubernetes 1.35, the last release that supports containerd 1.x),
// its ctr client and the runc shim for netclaim's local cluster nodes.
package tools

import (
	_ "github.com/containerd/containerd/cmd/containerd"
	_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/cmd/ctr"
)
