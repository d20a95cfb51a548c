"""The Kubernetes API boundary: the only package that imports lightkube (and its HTTP client).

One connection (connection.KubeConnection) per program, and over it the roles the core depends on
(netclaim.kubeapi), each a class of its own: claims.KubeClaims, slices.KubeSlices, addresses.KubeAddresses;
the operator tools' reads are reader.KubeClusterReader. They hand out the types of netclaim.objects and
netclaim's errors (connection.translated says which answer becomes which).
"""
