"""PodResources API (kubelet `pod-resources/kubelet.sock`)."""
