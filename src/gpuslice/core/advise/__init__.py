"""`gpuslice advise`'s pure core: series in, a sharing plan per GPU model out (no I/O)."""

from gpuslice.core.advise.advice import Advice, ModelAdvice, advise
from gpuslice.core.advise.configs import NamedConfig, named_configs
from gpuslice.core.advise.durations import parse_duration
from gpuslice.core.advise.history import (
    POD_MEMORY,
    SERIES_READ,
    AdviseError,
    History,
    RawSeries,
    build_history,
)
from gpuslice.core.advise.report import advice_to_dict

__all__ = [
    "POD_MEMORY",
    "SERIES_READ",
    "Advice",
    "AdviseError",
    "History",
    "ModelAdvice",
    "NamedConfig",
    "RawSeries",
    "advice_to_dict",
    "advise",
    "build_history",
    "named_configs",
    "parse_duration",
]
