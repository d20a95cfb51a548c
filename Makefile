# Two commands on a fresh machine (root): `make demo` and `make test`. Everything else is set-up they call.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-stamp
APT_PACKAGES := runc containernetworking-plugins busybox-static iproute2 iperf3 util-linux procps ethtool mmdebstrap nftables
CLUSTER_FILE ?= examples/demo/cluster.yaml

.PHONY: deps system-deps bins deploy image proto proto-check test test-tools test-recipes test-debian-cni test-matrix unit lint typecheck bench bench-scale bench-policy bench-policy-tables soak demo demo-down clean

deps: system-deps $(DEPS_STAMP)

system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends $$missing || { apt-get update && apt-get install -y --no-install-recommends $$missing; }; \
	fi
	@command -v go >/dev/null || { echo "Go ≥ 1.26 is required on PATH to build the pinned cluster programs (https://go.dev/dl)"; exit 1; }

# The product (src/netclaim) and the lab (lab/: local cluster, image builder, demo, benchmarks), both editable.
$(DEPS_STAMP): pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./lab
	touch $@

bins: deps
	$(BIN)/netclaim-lab cluster build

# deploy/ is the chart rendered with its default values (netclaim_lab.manifests): edit the chart, then
# run this; tests/test_helm_chart.py fails when they drift.
deploy: bins
	$(BIN)/python -m netclaim_lab.manifests

# The agent's image without a container engine (mmdebstrap + pip --target), reproducible and cached:
# build/netclaim-image.tar, for `ctr -n k8s.io images import` or `skopeo copy oci-archive:...` to a registry.
image: deps
	$(BIN)/netclaim-lab cluster image

PROTOS := $(wildcard proto/netclaim/_proto/*.proto)
GRPC_PROTOS := proto/netclaim/_proto/dra_health_v1.proto proto/netclaim/_proto/dra_v1.proto proto/netclaim/_proto/pluginregistration.proto

# Our own .proto files (written from the published names and field numbers) -> checked-in stubs: the messages
# (protobuf, typed by mypy-protobuf) and the services for grpclib (its protoc plugin; typed as generated).
proto: deps
	rm -f src/netclaim/_proto/*_pb2*.py src/netclaim/_proto/*_pb2*.pyi src/netclaim/_proto/*_grpc.py
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -I proto --python_out=src --mypy_out=quiet:src $(PROTOS)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -I proto --grpclib_python_out=src $(GRPC_PROTOS)

# CI: the checked-in stubs must be what the .proto files generate.
proto-check: proto
	@git diff --exit-code --stat -- src/netclaim/_proto || { echo "generated stubs are stale: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- src/netclaim/_proto)" || { git status --porcelain -- src/netclaim/_proto; echo "untracked/removed stubs: run make proto and commit"; exit 1; }

lint: deps
	$(BIN)/ruff check src lab tests
	$(BIN)/ruff format --check src lab tests
	$(BIN)/lint-imports --no-cache

typecheck: deps
	$(BIN)/mypy

# Unit tests alone, with the line coverage of the agent's and the core's code (>= 90 %).
unit: deps
	$(BIN)/pytest -m 'not cluster and not image and not programs and not recipes and not release' -p no:cacheprovider --cov=netclaim.agent --cov=netclaim.core \
	  --cov-report=term-missing --cov-fail-under=90 tests

# What CI runs: lint, types, import contracts, unit tests and every feature's cluster acceptance tests;
# --durations and the ten slowest modules at the end say where a slow run spent its time.
# Two workers: the session cluster's tests on one, everything else (unit, image, side clusters) beside them.
test: deps bins proto-check lint typecheck
	$(BIN)/pytest -n 2 -m 'not tools and not recipes and not release' --durations=30 tests

# The lab's measuring programs run small (bench, bench-scale, the whereabouts comparison), each on a cluster
# of its own: that they run and report, no figure asserted (~10 min; not in `make test`).
test-tools: deps bins
	$(BIN)/pytest -m tools --durations=10 tests

# The image by its other recipes: the Containerfile built by buildah (then the demo run on it) and the arm64
# image built under qemu-user, each compared with `make image`'s (~10 min; not in `make test`).
RECIPE_PACKAGES = buildah qemu-user-static binfmt-support arch-test
test-recipes: deps bins
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(RECIPE_PACKAGES)"
	@[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	@[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
	$(BIN)/pytest -m recipes --durations=10 tests

# The cluster suite again with every node on Debian's 1.0-level CNI plugins instead of the reference set
# (the plugin sets the README's compatibility table names); ~30 min. Without test_cni_lifecycle: STATUS, GC
# and a CHECK round's repair need CNI 1.1 plugins (tests/test_cni_plugins.py runs CHECK on both sets)
test-debian-cni: deps bins
	NETCLAIM_TEST_CNI_PLUGINS=debian $(BIN)/pytest --durations=30 -m cluster \
	  --ignore=tests/cluster/test_cni_lifecycle.py tests

# The Kubernetes and runtime versions README claims: the lab's cluster on each Kubernetes version (with
# containerd 2.4), then on each older containerd and on CRI-O (with Kubernetes 1.37), their programs built from
# the module proxy and cached like the pinned ones (tools/k8s/kubernetes-1.N, tools/k8s/containerd-2.N,
# tools/k8s/crio-1.N); the demo's, fail-closed, IPAM and NRI call tests on each. Then the upgrade from the last release (tests/cluster/test_release_upgrade.py).
MATRIX ?= 1.34 1.35 1.36 1.37
CONTAINERD_MATRIX ?= 2.0 2.2
# containerd 1.x runs only under kubelet <= 1.35: its round pairs the two; CONTAINERD_1X_MATRIX="" skips it
CONTAINERD_1X_MATRIX ?= 1.7
MATRIX_TESTS = tests/cluster/test_demo.py tests/cluster/test_fail_closed.py tests/cluster/test_ipam.py \
  tests/cluster/test_nri_versions.py
# CRI-O's round needs Debian's conmon, and gcc for its pinns (C); CRIO_MATRIX="" skips it
CRIO_MATRIX ?= 1.36
test-matrix: deps bins
	$(if $(CRIO_MATRIX),$(MAKE) system-deps APT_PACKAGES="conmon gcc libc6-dev")
	$(BIN)/netclaim-lab cluster build $(foreach v,$(filter-out 1.37,$(MATRIX)),--kubernetes $(v)) \
	  $(foreach v,$(CONTAINERD_MATRIX) $(CONTAINERD_1X_MATRIX),--containerd $(v)) \
	  $(if $(CONTAINERD_1X_MATRIX),--kubernetes 1.35) $(foreach v,$(CRIO_MATRIX),--crio $(v))
	set -e; for version in $(MATRIX); do \
	  echo "== Kubernetes $$version, containerd 2.4"; \
	  NETCLAIM_TEST_KUBERNETES=$$version $(BIN)/pytest -p no:cacheprovider -m cluster $(MATRIX_TESTS); \
	done; \
	for version in $(CONTAINERD_MATRIX); do \
	  echo "== Kubernetes 1.37, containerd $$version"; \
	  NETCLAIM_TEST_CONTAINERD=$$version $(BIN)/pytest -p no:cacheprovider -m cluster $(MATRIX_TESTS); \
	done; \
	for version in $(CONTAINERD_1X_MATRIX); do \
	  echo "== Kubernetes 1.35, containerd $$version"; \
	  NETCLAIM_TEST_KUBERNETES=1.35 NETCLAIM_TEST_CONTAINERD=$$version $(BIN)/pytest -p no:cacheprovider \
	    -m cluster $(MATRIX_TESTS); \
	done; \
	for version in $(CRIO_MATRIX); do \
	  echo "== Kubernetes 1.37, CRI-O $$version"; \
	  NETCLAIM_TEST_RUNTIME=crio $(BIN)/pytest -p no:cacheprovider -m cluster $(MATRIX_TESTS); \
	done; \
	echo "== helm upgrade from the last release's tag and rollback to it, under churn"; \
	$(BIN)/pytest -p no:cacheprovider -m release tests

# Figures, not assertions: the costs against a floor from the same run, on a cluster of its own
# (netclaim_lab.benchmarks.suite); writes bench/report.json, docs/benchmarks.md and its plots.
# The last line is the BENCH line.
bench: deps bins
	$(BIN)/python -m netclaim_lab.benchmarks.suite

# The control plane's cost as the cluster grows: 3, 100 and 500 kubelet-less nodes, five scheduling arms of
# 5,000 pods three times (netclaim_lab.benchmarks.scale; an hour or more on 2 cores: each arm's run takes 1 to
# 10 min; --repeats 1 for one run of each); writes bench/scale.json and docs/scale.md's table, and each arm's run
# to bench/scale-partial.json as soon as it ends (a run stopped early keeps them).
bench-scale: deps bins
	$(BIN)/python -m netclaim_lab.benchmarks.scale

# The controller at 10,000 pods, 1,000 MultiNetworkPolicies and 50,000 claims, on simulated nodes
# (netclaim_lab.benchmarks.controller_scale; bench/controller.json and the POLICY line).
bench-policy: deps bins
	$(BIN)/python -m netclaim_lab.benchmarks.controller_scale

# The agents' tables at 200 pods and 100 policies on the test cluster's real nodes
# (netclaim_lab.benchmarks.policy_scale: rules per pod, the time to apply them all, a relabelled peer).
bench-policy-tables: deps bins
	$(BIN)/python -m netclaim_lab.benchmarks.policy_scale 200 100

# 1,000 pod create/delete cycles (about 35 min on 2 cores); exits 1 if anything leaked.
soak: deps bins
	$(BIN)/python -m netclaim_lab.benchmarks.soak 100 10

demo: deps bins
	$(BIN)/netclaim-lab demo -f $(CLUSTER_FILE)

demo-down: deps
	$(BIN)/netclaim-lab cluster down -f $(CLUSTER_FILE)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
