"""DRA API v1: what kubelets 1.34 and newer call first."""
