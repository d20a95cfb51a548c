//go:build tools

// Package tools pins helm, which renders charts/netclaim (tests/test_helm_chart.py compares its output
// with deploy/).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
