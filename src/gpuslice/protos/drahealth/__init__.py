"""Kubelet DRA device health API (KEP-4680), an optional service on a driver's dra.sock."""
