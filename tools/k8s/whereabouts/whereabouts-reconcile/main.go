// Command whereabouts-reconcile runs whereabouts' reconciler once, against the cluster a kubeconfig
// names: it frees every IPPool allocation and OverlappingRangeIPReservation whose pod is gone or does not
// list the address in its network-status annotation, then exits.
//
// Upstream runs the same logic only inside ip-control-loop, which reads the in-cluster config and
// reconciles on a cron schedule (daily by default); the comparison test needs one pass, on demand, from
// outside the cluster.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/k8snetworkplumbingwg/whereabouts/pkg/logging"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/reconciler"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
)

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "whereabouts-reconcile: %s: %v\n", step, err)
	os.Exit(1)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster whose whereabouts pools to reconcile (required)")
	level := flag.String("log-level", "error", "whereabouts log level: debug, verbose, error or panic")
	flag.Parse()
	if *kubeconfig == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	logging.SetLogStderr(true)
	logging.SetLogLevel(*level)

	client, err := kubernetes.NewClientViaKubeconfig(*kubeconfig)
	if err != nil {
		fail("kubeconfig", err)
	}
	// Listing pools, pods and reservations happens here: the looper holds what it will free.
	looper, err := reconciler.NewReconcileLooperWithClient(client)
	if err != nil {
		fail("listing pools and pods", err)
	}
	freed, err := looper.ReconcileIPPools()
	if err != nil {
		fail("freeing pool allocations", err)
	}
	if err := looper.ReconcileOverlappingIPAddresses(); err != nil {
		fail("freeing overlapping-range reservations", err)
	}
	// One line a caller can parse: how many addresses, then which.
	fmt.Printf("freed %d", len(freed))
	for _, ip := range freed {
		fmt.Printf(" %s", ip)
	}
	fmt.Println()
}
