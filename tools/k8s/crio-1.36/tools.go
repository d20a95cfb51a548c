//go:build tools

// Package tools pins CRI-O 1.36 (NRI v0.11: pod events as StateChange; make test-matrix) for netclaim's
// local cluster nodes; crio-import, beside it, copies the lab's OCI archives into CRI-O's storage.
package tools

import _ "github.com/cri-o/cri-o/cmd/crio"
