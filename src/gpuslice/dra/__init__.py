"""The kubelet-facing side of gpuslice's DRA driver: DRA gRPC service and plugin registration.

An adapter like `kubelet` (the device plugin side): it speaks the kubelet's wire protocols
over unix sockets and hands plain `gpuslice.core.dra` data to a `ClaimPreparer`.
"""
