"""PodResources API v1 messages (generated `api_pb2`)."""
