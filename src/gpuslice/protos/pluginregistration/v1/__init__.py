"""Plugin registration v1 (proto package `pluginregistration`)."""
