"""Generated protobuf modules for the kubelet APIs (see scripts/gen-protos)."""
