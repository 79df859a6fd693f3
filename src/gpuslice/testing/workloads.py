"""Seeded synthetic GPU workloads, written as the exporter's series with timestamps.

`gpuslice advise` must find answers known by construction: the pods' peaks, who leaks,
who is idle, are chosen here, and the series are written as OpenMetrics text (what
`promtool tsdb create-blocks-from openmetrics` loads into a real Prometheus, and what
`advise --samples` reads), with the labels the exporter puts on them (docs/metrics.md).
Each pod reaches its chosen peak exactly, at least once; the rest of its samples stay
below it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from gpuslice.core.gpumodels import MODELS
from gpuslice.core.units import MIB

Kind = Literal["steady", "bursty", "leaker", "idle"]


@dataclass(frozen=True, slots=True)
class SynthPod:
    name: str
    gpu: int
    kind: Kind
    peak_mib: int
    """The largest value written (a leaker: where its growth ends)."""
    start: int = 0
    """Grid index of its first sample."""
    samples: int = 0
    """0: until the end of the workload."""
    namespace: str = "ml"


@dataclass(frozen=True, slots=True)
class Workload:
    model: str
    """Simulator spec name (`h100-80gb`)."""
    gpus: int
    replicas: int
    """The config the pods ran under: 1 / replicas is their entitled SM fraction."""
    pods: tuple[SynthPod, ...]
    points: int
    step_s: float
    end: float
    """Unix time of the last sample."""
    hostname: str = "node-1"

    @property
    def start(self) -> float:
        return self.end - (self.points - 1) * self.step_s

    def uuid(self, gpu: int) -> str:
        return f"GPU-{self.model}-{self.hostname}-{gpu:04d}"


def six_pods_and_a_leaker(
    end: float, *, points: int = 480, step_s: float = 15.0, hostname: str = "node-1"
) -> Workload:
    """Six pods peaking at 9 GiB and one leaker on two H100s run at replicas 4: advise
    should say replicas 8 (81559 MiB / 8 holds 9 GiB + 10 %, / 9 does not) and name
    the leaker."""
    pods = [
        SynthPod(f"train-{i}", i % 2, "bursty" if i % 2 else "steady", 9 * 1024) for i in range(6)
    ]
    pods.append(SynthPod("leaky", 1, "leaker", 30 * 1024))
    return Workload("h100-80gb", 2, 4, tuple(pods), points, step_s, end, hostname)


DOCS_EXAMPLE_END = 1_795_000_000.0


def docs_example(end: float = DOCS_EXAMPLE_END) -> Workload:
    """`six_pods_and_a_leaker` over two hours at a 2-minute step: the samples file
    docs/advise.md runs on (`docs/examples/node-1.om`, `scripts/advise-samples`), small
    enough to ship and still the same advice (replicas 8, the leaker named)."""
    return six_pods_and_a_leaker(end, points=60, step_s=120.0)


def idle_node(
    end: float, *, points: int = 240, step_s: float = 15.0, hostname: str = "node-2"
) -> Workload:
    """Four pods on two L40S that hold replicas and never touch the GPU."""
    pods = tuple(SynthPod(f"notebook-{i}", i % 2, "idle", 0) for i in range(4))
    return Workload("l40s", 2, 2, pods, points, step_s, end, hostname)


def fleet(
    end: float, *, pods: int, days: float, step_s: float = 15.0, replicas: int = 4, seed: int = 1
) -> Workload:
    """`pods` pods arriving over `days` on H100s, each living 1 to 24 hours, placed on
    the first GPU with a free replica (as many GPUs as that takes): mostly steady or
    bursty with peaks from 2 to 16 GiB, 2 % leakers, 5 % idle."""
    rng = random.Random(seed)
    points = int(days * 86400 / step_s) + 1
    made: list[SynthPod] = []
    busy: list[list[int]] = []  # per GPU: end indices of its pods
    starts = sorted(rng.randrange(0, points - 8) for _ in range(pods))
    for i, start in enumerate(starts):
        life = min(points - start, max(8, int(rng.uniform(3600, 86400) / step_s)))
        gpu = next(
            (g for g, ends in enumerate(busy) if sum(1 for e in ends if e >= start) < replicas),
            len(busy),
        )
        if gpu == len(busy):
            busy.append([])
        busy[gpu].append(start + life - 1)
        roll = rng.random()
        kind: Kind = (
            "leaker" if roll < 0.02 else "idle" if roll < 0.07 else rng.choice(["steady", "bursty"])
        )
        peak = 0 if kind == "idle" else rng.randrange(2048, 16 * 1024, 256)
        made.append(SynthPod(f"job-{i:04d}", gpu, kind, peak, start, life))
    return Workload("h100-80gb", len(busy), replicas, tuple(made), points, step_s, end)


def memory_mib(pod: SynthPod, samples: int, rng: random.Random) -> list[int]:
    """Its memory per sample; the peak is reached exactly and never exceeded."""
    if pod.kind == "idle":
        return [0] * samples
    if pod.kind == "leaker":
        base = min(4096, pod.peak_mib)
        return [base + (pod.peak_mib - base) * i // max(1, samples - 1) for i in range(samples)]
    if pod.kind == "steady":
        base = pod.peak_mib * 85 // 100
        out = [base + rng.randrange(0, max(1, pod.peak_mib - base)) for _ in range(samples)]
    else:
        base = pod.peak_mib * 60 // 100
        out = [
            pod.peak_mib - rng.randrange(0, 256) if i % 10 == 5 else base + rng.randrange(0, 512)
            for i in range(samples)
        ]
    out[rng.randrange(samples)] = pod.peak_mib
    return [min(v, pod.peak_mib) for v in out]


def sm_percent(pod: SynthPod, samples: int, rng: random.Random) -> list[float]:
    if pod.kind == "idle":
        return [0.0] * samples
    return [float(rng.randrange(5, 60)) for _ in range(samples)]


@dataclass(frozen=True, slots=True)
class _Series:
    name: str
    labels: str
    start: int
    values: Sequence[float]


def _series(w: Workload, seed: int) -> Iterator[_Series]:
    rng = random.Random(seed)
    model = MODELS[w.model]
    used_per_gpu = [[0] * w.points for _ in range(w.gpus)]
    entitled = 1 / w.replicas
    for pod in w.pods:
        n = pod.samples or (w.points - pod.start)
        uuid = w.uuid(pod.gpu)
        labels = (
            f'namespace="{pod.namespace}",pod="{pod.name}",container="main",'
            f'gpu="{pod.gpu}",UUID="{uuid}"'
        )
        mem = memory_mib(pod, n, rng)
        for i, v in enumerate(mem):
            used_per_gpu[pod.gpu][pod.start + i] += v
        yield _Series("gpuslice_pod_memory_used_bytes", labels, pod.start, [v * MIB for v in mem])
        yield _Series("gpuslice_pod_sm_util_percent", labels, pod.start, sm_percent(pod, n, rng))
        yield _Series("gpuslice_pod_entitled_sm_fraction", labels, pod.start, [entitled] * n)
    for gpu in range(w.gpus):
        labels = (
            f'gpu="{gpu}",UUID="{w.uuid(gpu)}",modelName="{model.product_name}",'
            f'Hostname="{w.hostname}"'
        )
        used = [min(u, model.memory_mib) for u in used_per_gpu[gpu]]
        yield _Series("DCGM_FI_DEV_FB_USED", labels, 0, used)
        yield _Series("DCGM_FI_DEV_FB_FREE", labels, 0, [model.memory_mib - u for u in used])


def write_openmetrics(workloads: Sequence[Workload], out: TextIO, *, seed: int = 0) -> None:
    """The workloads' series as one OpenMetrics text (each family once, as the format
    requires), `# EOF` last. Give each workload its own `hostname`: GPU UUIDs are made
    from it."""
    by_family: dict[str, list[tuple[Workload, _Series]]] = {}
    for n, w in enumerate(workloads):
        for s in _series(w, seed + n):
            by_family.setdefault(s.name, []).append((w, s))
    for name, series in by_family.items():
        out.write(f"# TYPE {name} gauge\n")
        for w, s in series:
            head = f"{name}{{{s.labels}}} "
            start = w.start
            out.writelines(
                f"{head}{v!r} {start + (s.start + i) * w.step_s:.3f}\n"
                for i, v in enumerate(s.values)
            )
    out.write("# EOF\n")
