# The netclaim agent image for deploy/daemonset.yaml (no image is built on the project's own machines).
#   docker build -t registry.example.com/netclaim:0.1.0 . && docker push registry.example.com/netclaim:0.1.0
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
ENTRYPOINT ["netclaim"]
CMD ["agent"]
