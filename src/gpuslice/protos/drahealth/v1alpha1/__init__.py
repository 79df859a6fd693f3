"""DRA resource health v1alpha1 (proto package `v1alpha1`; advertised as such)."""
