"""The plugin-watcher Registration service on `<registry_dir>/<driver>-reg.sock`.

The kubelet finds a DRA driver by this socket appearing, asks `GetInfo` where the DRA
service is and which API versions it speaks, and reports the outcome through
`NotifyRegistrationStatus`. A rejection (e.g. no common API version) is nowhere else visible
to the driver, so it is logged and kept here for the driver and tests to read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.dra.rpc import PLUGIN_TYPE
from gpuslice.dra.servicer import bounded
from gpuslice.protos.pluginregistration.v1 import api_pb2 as reg


class RegistrationStatus:
    """What the kubelet last said about our registration.

    `registered` is set while the kubelet has accepted us; `notified` is set on every
    notification (accepted or not) so a waiter can see a rejection; `error` is the
    kubelet's last rejection text ("" after an acceptance).
    """

    def __init__(self) -> None:
        self.registered = asyncio.Event()
        self.notified = asyncio.Event()
        self.accepted: bool | None = None
        self.error = ""

    def reset(self) -> None:
        """Forget the last answer: our socket was recreated, the kubelet will ask again."""
        self.registered.clear()
        self.notified.clear()
        self.accepted = None
        self.error = ""


class RegistrationServicer:
    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str],
        *,
        status: RegistrationStatus,
        logger: BoundLogger,
    ) -> None:
        self._info = reg.PluginInfo(
            type=PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=versions
        )
        self._status = status
        self._log = logger

    async def get_info(
        self, request: reg.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reg.PluginInfo:
        self._log.info("dra-get-info", driver=self._info.name, endpoint=self._info.endpoint)
        return self._info

    async def notify_registration_status(
        self, request: reg.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        status = self._status
        status.accepted = request.plugin_registered
        if request.plugin_registered:
            status.error = ""
            status.registered.set()
            self._log.info("dra-registered", driver=self._info.name)
        else:
            status.error = bounded(request.error)
            status.registered.clear()
            self._log.error("dra-registration-rejected", driver=self._info.name, error=status.error)
        status.notified.set()
        return reg.RegistrationStatusResponse()
