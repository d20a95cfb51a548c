//go:build tools

// Package tools pins containerd 2.2 (NRI v0.11: pod events as StateChange; make test-matrix), its ctr
// client and the runc shim for netclaim's local cluster nodes.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
