"""Opaque config kinds: one module per kind, registered in `registry.KINDS`.

A kind module holds the kind's strict model (the fields its API documents, no more), which
devices it fits, which aspect of a device it configures (its slot) and the slot's record it
makes of a config (a kind sets its own slot, no other's). `core.dra.sharing.resolve` walks
NVIDIA's precedence once per slot and knows no kind by name, and the chart's admission
policy is generated from the registry (`admission`, `scripts/gen-claim-policy`), so a new
kind is its module, one line in `registry.KINDS` and its tests (with its cases in the
corpus Prepare and admission are both held to).
"""
