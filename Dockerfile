# The netclaim image (agent and controller) for deploy/daemonset.yaml and deploy/controller.yaml, for
# people with a container engine:
#   docker build -t registry.example.com/netclaim:0.1.0 . && docker push registry.example.com/netclaim:0.1.0
# `make image` builds the same packages, lock and wheel without an engine (src/netclaim/cluster/agent_image.py,
# reproducibly), on an essential-only root without apt, which bookworm-slim keeps:
# Debian bookworm with its python3 and image/debian-packages.txt (iptables, nftables, ...), the hash-pinned
# image/requirements.lock and netclaim's wheel; no pip, compilers or docs in the final image.

# pip runs here only: the final stage copies what it installed.
FROM debian:bookworm-slim AS python-packages
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY image/requirements.lock image/build-constraints.txt ./image/
COPY src ./src
# PIP_CONSTRAINT reaches the isolated build environment: the pinned setuptools makes the wheel.
RUN PIP_CONSTRAINT=image/build-constraints.txt pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-deps --no-compile --require-hashes --target /site -r image/requirements.lock \
 && pip install --no-cache-dir --no-deps --no-compile --no-index --find-links /wheels --target /site netclaim \
 && rm -rf /site/bin

FROM debian:bookworm-slim
COPY image/debian-packages.txt /tmp/
RUN apt-get update \
 && sed 's/#.*//' /tmp/debian-packages.txt | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /tmp/debian-packages.txt
COPY --from=python-packages /site /usr/local/lib/python3.11/dist-packages
COPY image/netclaim /usr/local/bin/netclaim
RUN python3 -m compileall -q --invalidation-mode unchecked-hash /usr/local/lib/python3.11/dist-packages
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/netclaim"]
CMD ["agent"]
