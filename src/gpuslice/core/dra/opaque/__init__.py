"""Opaque config kinds: one module per kind, registered in `registry.KINDS`.

A kind module holds the kind's strict model (the fields its API documents, no more), which
devices it fits, which aspect of a device it configures (its slot) and what it contributes
to the device's resolved `Sharing`. `core.dra.sharing.resolve` walks NVIDIA's precedence
once per slot and knows no kind by name, so a new kind is its module, one line in
`registry.KINDS` and its tests (plus, to be refused at admission as Prepare refuses it, its
case in the chart's claim-config policy and the shared corpus).
"""
