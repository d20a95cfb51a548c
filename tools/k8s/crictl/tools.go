//go:build tools

// Package tools pins crictl, used to inspect each local node's containerd.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
