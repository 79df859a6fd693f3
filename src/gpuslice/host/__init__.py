"""Adapters for the node host: config files, the NFD label file, /proc."""
