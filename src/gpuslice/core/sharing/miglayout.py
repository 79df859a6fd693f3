"""Whether a node's MIG layout fits `migStrategy: single`, as NVIDIA judges it.

One answer for the plan and the labels: the plugin advertises nothing for a layout it cannot
serve, and the labels then say `<model>-MIG-INVALID`, so a scheduler never sees a product it
cannot get. NVIDIA's plugin compares MIG devices by their NVML attributes, not by profile
name (`internal/rm/device_map.go`, `assertAllMigDevicesAreValid(uniform=true)`): a 1g.10gb
with 14 SMs (A100-80GB) and a 1g.10gb with 16 SMs (H100) are two device types.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.devices import Gpu, MigDevice


def mig_attributes(mig: MigDevice) -> tuple[int, ...]:
    """The fields of NVML's `nvmlDeviceAttributes_t` that the plugin compares."""
    return (
        mig.multiprocessors,
        mig.engines_copy,
        mig.engines_decoder,
        mig.engines_encoder,
        mig.engines_jpeg,
        mig.engines_ofa,
        mig.slices_gi,
        mig.slices_ci,
        mig.memory_mib,
    )


def single_layout_problem(gpus: Sequence[Gpu]) -> str | None:
    """Why `single` cannot serve this node (NVIDIA's wording, then what to change), or None.

    None also when no GPU has MIG enabled: `single` then advertises whole GPUs.
    """
    enabled = [g.index for g in gpus if g.mig_enabled]
    disabled = [g.index for g in gpus if not g.mig_enabled]
    if not enabled:
        return None
    if disabled:
        return (
            "all devices on the node must be configured with the same migEnabled value "
            f"(MIG enabled on GPUs {enabled}, disabled on GPUs {disabled}); with migStrategy "
            "'single' enable MIG on every GPU or on none, or use migStrategy 'mixed'"
        )
    for gpu in sorted(gpus, key=lambda g: g.index):
        if not gpu.mig_devices:
            return (
                f"device {gpu.index} has no MIG devices configured; create MIG devices on it "
                "(e.g. with mig-parted or `nvidia-smi mig -cgi ... -C`), or use migStrategy "
                "'mixed'"
            )
    migs = [m for g in gpus for m in g.mig_devices]
    # GFD's labeler compares profile names, the plugin compares attributes: either differing
    # makes a second type, so labels and advertised devices never disagree.
    if len({(m.profile, mig_attributes(m)) for m in migs}) > 1:
        profiles = sorted({m.profile for m in migs})
        listed = ", ".join(profiles)
        if len(profiles) == 1:
            sms = ", ".join(str(n) for n in sorted({m.multiprocessors for m in migs}))
            listed += f" with different attributes on different GPUs: {sms} SMs"
        return (
            f"more than one MIG device type present on node ({listed}); "
            "migStrategy 'single' needs MIG devices with identical attributes (profile, "
            "memory, SMs, engines) on every GPU: repartition the GPUs, or use migStrategy "
            "'mixed'"
        )
    return None
