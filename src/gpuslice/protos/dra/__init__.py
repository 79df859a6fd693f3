"""Kubelet DRA plugin API (`k8s.io.kubelet.pkg.apis.dra`), served on the driver's dra.sock."""
