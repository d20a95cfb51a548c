//go:build tools

// Package tools pins whereabouts, the cluster-wide IPAM CNI plugin netclaim's own IPAM is measured
// against (tests/cluster/test_ipam_comparison.py).
package tools

import _ "github.com/k8snetworkplumbingwg/whereabouts/cmd"
