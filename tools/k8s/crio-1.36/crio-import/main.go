// Command crio-import copies an OCI archive into the containers-storage of a CRI-O node, under the name
// the archive's index gives it: the lab's images (the pause image, busybox, the agent's) cannot be pulled
// from a registry here, and CRI-O imports nothing itself (containerd's `ctr images import` does).
//
// Usage: crio-import ROOT RUNROOT DRIVER REFERENCE=ARCHIVE...
//
// ROOT, RUNROOT and DRIVER are CRI-O's [crio] root, runroot and storage_driver; each ARCHIVE (an OCI
// archive of one image) is stored as REFERENCE, e.g. netclaim.local/pause:1. The libraries are the ones
// CRI-O is built from (this module's pin), so the storage is written as that CRI-O reads it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/oci/archive"
	"go.podman.io/image/v5/signature"
	"go.podman.io/image/v5/storage"
	cstorage "go.podman.io/storage"
	"go.podman.io/storage/pkg/reexec"
)

func main() {
	if reexec.Init() { // the storage library applies layers in a re-executed child of this program
		return
	}
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: crio-import ROOT RUNROOT DRIVER REFERENCE=ARCHIVE...")
		os.Exit(2)
	}
	store, err := cstorage.GetStore(cstorage.StoreOptions{
		GraphRoot: os.Args[1], RunRoot: os.Args[2], GraphDriverName: os.Args[3],
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crio-import: storage:", err)
		os.Exit(1)
	}
	code := 0
	for _, arg := range os.Args[4:] {
		name, path, found := strings.Cut(arg, "=")
		if !found {
			fmt.Fprintf(os.Stderr, "crio-import: %q: not REFERENCE=ARCHIVE\n", arg)
			code = 2
			break
		}
		if err := importArchive(context.Background(), store, name, path); err != nil {
			fmt.Fprintf(os.Stderr, "crio-import: %s: %v\n", path, err)
			code = 1
			break
		}
	}
	// a running CRI-O's containers keep their layers mounted: Shutdown(false) leaves them so and says so
	if _, err := store.Shutdown(false); err != nil && !errors.Is(err, cstorage.ErrLayerUsedByContainer) && code == 0 {
		fmt.Fprintln(os.Stderr, "crio-import: storage shutdown:", err)
		code = 1
	}
	os.Exit(code)
}

// importArchive copies the one image of the OCI archive at path into store as name.
func importArchive(ctx context.Context, store cstorage.Store, name, path string) error {
	source, err := archive.NewReference(path, "")
	if err != nil {
		return err
	}
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return fmt.Errorf("image name %q: %w", name, err)
	}
	destination, err := storage.Transport.NewStoreReference(store, named, "")
	if err != nil {
		return err
	}
	policy, err := signature.NewPolicyContext(&signature.Policy{
		Default: signature.PolicyRequirements{signature.NewPRInsecureAcceptAnything()},
	})
	if err != nil {
		return err
	}
	defer func() { _ = policy.Destroy() }()
	if _, err := copy.Image(ctx, policy, destination, source, &copy.Options{}); err != nil {
		return err
	}
	fmt.Printf("imported %s from %s\n", name, path)
	return nil
}
