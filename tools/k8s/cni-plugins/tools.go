//go:build tools

// Package tools pins the CNI reference plugins of containernetworking/plugins (spec 1.1: STATUS, GC), which
// the local cluster's agents run; Debian's 1.0-level build of the same plugins stays a tested choice. The
// list is netclaim_lab.binaries.REFERENCE_CNI_PLUGINS.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/dhcp"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/ipam/static"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/host-device"
	_ "github.com/containernetworking/plugins/plugins/main/ipvlan"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/macvlan"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/main/vlan"
	_ "github.com/containernetworking/plugins/plugins/meta/bandwidth"
	_ "github.com/containernetworking/plugins/plugins/meta/firewall"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
	_ "github.com/containernetworking/plugins/plugins/meta/sbr"
	_ "github.com/containernetworking/plugins/plugins/meta/tuning"
	_ "github.com/containernetworking/plugins/plugins/meta/vrf"
)
