"""The Kubernetes API boundary: the only package that imports lightkube (and its HTTP client).

One connection (connection.KubeConnection) per program, and over it the roles the core depends on
(netclaim.core.kubeapi), a class per kind of object playing the agent's and the controller's role of it:
claims.KubeClaims (ClaimsApi, ClusterClaimsApi), slices.KubeSlices (NodeSlicesApi, PoolSlicesApi),
addresses.KubeAddresses (AddressesApi, IPPoolsApi); the operator tools' reads are
reader.KubeClusterReader. They hand out the types of netclaim.core.objects and netclaim's errors
(connection.translated says which answer becomes which).
"""
