//go:build tools

// Package tools pins Prometheus' promtool: `promtool check rules` and `promtool test rules` on the chart's
// alerting rules (charts/netclaim/files/alerts.yaml), built without the service-discovery plugins
// (build tag remove_all_sd) that a rule check never uses.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
