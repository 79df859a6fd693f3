"""DRA API v1beta1: what kubelets 1.32 and 1.33 call, still understood by newer ones."""
