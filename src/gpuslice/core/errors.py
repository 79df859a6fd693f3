"""Errors the core raises. Each carries what a user needs to fix the input."""

from __future__ import annotations

from dataclasses import dataclass


class GpusliceError(Exception):
    """Base for errors that are reported to the user without a traceback."""


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One problem at one place in a config.

    `path` is the field path, e.g. `sharing.timeSlicing.resources[0].replicas`.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(GpusliceError):
    """A config file that cannot be used. Lists every problem found, each with its field path."""

    def __init__(self, problems: list[FieldProblem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        lines = [str(p) for p in problems]
        prefix = f"invalid config {source}: " if source else "invalid config: "
        super().__init__(prefix + "; ".join(lines))


class PlanError(GpusliceError):
    """The config cannot be applied to this node's GPUs (e.g. MIG single with mixed profiles)."""


class AllocationError(GpusliceError):
    """An Allocate or GetPreferredAllocation request that cannot be served.

    The message keeps NVIDIA's wording so existing runbooks and alerts still match.
    """
