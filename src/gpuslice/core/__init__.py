"""The pure core: config schema, device model, sharing plan, allocation policy, labels.

No module under this package performs I/O or imports grpc, protobuf, pynvml,
prometheus_client, a Kubernetes client, subprocess or asyncio (enforced by import-linter).
"""
