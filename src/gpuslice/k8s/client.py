"""Building the API client: from a kubeconfig file, a kubeconfig document, or in-cluster.

In a DaemonSet pod the service account (token, CA, namespace) is the normal case; a
kubeconfig is for running the agent by hand. A missing or broken source is reported as
one line naming what was tried, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ConfigError as LightkubeConfigError

from gpuslice.core.errors import GpusliceError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ClientSettingsError(GpusliceError):
    """No usable Kubernetes API credentials."""


def make_client(
    kubeconfig: Path | Mapping[str, Any] | None = None,
    *,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    field_manager: str = "gpuslice",
    trust_env: bool = True,
) -> AsyncClient:
    """An async client from `kubeconfig` (a file or a parsed document), or in-cluster
    credentials when it is None. `trust_env=False` ignores proxy variables (tests)."""
    try:
        if kubeconfig is None:
            config = KubeConfig.from_service_account(service_account_dir)
            where = f"in-cluster service account ({service_account_dir})"
        elif isinstance(kubeconfig, Path):
            config = KubeConfig.from_file(kubeconfig)
            where = f"kubeconfig {kubeconfig}"
        else:
            config = KubeConfig.from_dict(dict(kubeconfig))
            where = "kubeconfig document"
    except (LightkubeConfigError, KeyError, OSError, ValueError) as exc:
        what = "in-cluster service account" if kubeconfig is None else f"kubeconfig {kubeconfig}"
        hint = (
            " (is KUBERNETES_SERVICE_HOST set and the service account token mounted?)"
            if kubeconfig is None
            else ""
        )
        raise ClientSettingsError(f"cannot load {what}: {exc}{hint}") from exc
    try:
        return AsyncClient(config=config, field_manager=field_manager, trust_env=trust_env)
    except (LightkubeConfigError, AssertionError, OSError) as exc:
        raise ClientSettingsError(f"cannot use {where}: {exc}") from exc
