"""Kubelet plugin-watcher registration API (the `<driver>-reg.sock` of a DRA driver)."""
