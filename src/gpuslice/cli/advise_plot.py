"""`advise --plot`: each pod's memory over time against the recommended share, one panel
per GPU model, as a PNG. matplotlib is an optional extra (`gpuslice[plot]`): nothing else
needs it, and the node agent's image stays without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpuslice.core.advise import Advice, AdviseError, History

GIB = 1024.0


def check_available() -> None:
    """Fail before any query is made, not after."""
    if importlib.util.find_spec("matplotlib") is None:
        raise AdviseError(
            "--plot needs matplotlib, which is not installed: pip install 'gpuslice[plot]'"
        )


def draw(advice: Advice, history: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in advice.models if m.pods] or list(advice.models)
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 3.6 * max(1, len(models))), squeeze=False)
    step_h = history.step_s / 3600
    for ax, m in zip(axes[:, 0], models, strict=True):
        leakers = {id(p) for p in m.leakers}
        for p in m.pods:
            xs = [(p.trace.first + i) * step_h for i in range(len(p.trace.memory_mib))]
            ys = [v / GIB for v in p.trace.memory_mib]
            leaking = id(p) in leakers
            ax.plot(
                xs,
                ys,
                linewidth=1.6 if leaking else 0.8,
                color="tab:red" if leaking else None,
                alpha=1.0 if leaking else 0.7,
                label=f"{p.name} (leaker)" if leaking else None,
            )
        ts = m.time_slicing
        if ts is not None:
            ax.axhline(ts.share_mib / GIB, color="black", linestyle="--", linewidth=1.2)
            ax.axhline(ts.need_mib / GIB, color="tab:green", linestyle=":", linewidth=1.0)
            ax.text(
                0.0,
                ts.share_mib / GIB,
                f" share at replicas {ts.replicas}: {ts.share_mib / GIB:.2f} GiB",
                va="bottom",
                fontsize=8,
            )
            ax.text(
                1.0,
                ts.need_mib / GIB,
                f"largest peak + {advice.headroom_percent:g}% ",
                va="top",
                ha="right",
                fontsize=8,
                color="tab:green",
                transform=ax.get_yaxis_transform(),
            )
            title = f"{m.model}: replicas {ts.replicas}"
            if m.current_replicas:
                title += f" (now {m.current_replicas})"
        else:
            title = f"{m.model}: idle" if m.idle else f"{m.model}: nothing to size"
        ax.set_title(f"{title}, {len(m.pods)} pods", fontsize=10, loc="left")
        ax.set_xlabel("hours from the start of the range")
        ax.set_ylabel("GPU memory (GiB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if m.leakers:
            ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
