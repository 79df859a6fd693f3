"""Registering a plugin socket with the kubelet, retried until it works.

A kubelet that is not up yet, or is restarting, is normal on a node: a failed registration
is logged and retried with backoff instead of failing the daemon. When the kubelet's socket
is recreated the manager wakes any retry still waiting, so a restarted kubelet is answered
at once rather than after the backoff.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.aio.waiting import sleep_unless_stopped
from gpuslice.core.backoff import Backoff as Backoff  # re-exported: shared with the k8s side
from gpuslice.kubelet.rpc import RegistrationClient, unix_target
from gpuslice.protos.deviceplugin.v1beta1 import api_pb2 as api


class RegistrationFailed(Exception):
    """One registration attempt did not go through; the message says why."""


async def register_once(
    kubelet_socket: Path, request: api.RegisterRequest, *, timeout_s: float
) -> None:
    async with grpc.aio.insecure_channel(unix_target(str(kubelet_socket))) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout_s)
        except TimeoutError:
            raise RegistrationFailed(
                f"no answer on kubelet socket {kubelet_socket} within {timeout_s:g}s"
            ) from None
        try:
            await RegistrationClient(channel).register(request, timeout_s=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationFailed(
                f"kubelet refused registration: {exc.code().name}: {exc.details()}"
            ) from None


async def register_until_done(
    kubelet_socket: Path,
    request: api.RegisterRequest,
    *,
    timeout_s: float,
    backoff: Backoff,
    logger: BoundLogger,
    wake: asyncio.Event | None = None,
) -> SocketId:
    """Register, retrying with backoff; setting `wake` cuts a backoff wait short.

    Returns the identity of the kubelet socket that accepted us (read before the attempt, so
    a kubelet that restarts during the attempt shows up as a different identity later).
    """
    wake = wake or asyncio.Event()
    attempt = 0
    while True:
        attempt += 1
        wake.clear()
        seen = socket_identity(kubelet_socket)
        try:
            if seen is None:
                raise RegistrationFailed(f"kubelet socket {kubelet_socket} does not exist")
            await register_once(kubelet_socket, request, timeout_s=timeout_s)
        except Exception as exc:  # any failed attempt is retried; the daemon keeps serving
            delay = backoff.delay(attempt)
            logger.warning(
                "register-failed",
                resource=request.resource_name,
                socket=request.endpoint,
                attempt=attempt,
                retry_in_s=round(delay, 2),
                error=str(exc),
            )
            await sleep_unless_stopped(wake, delay)
            continue
        logger.info(
            "registered",
            resource=request.resource_name,
            socket=request.endpoint,
            kubelet=str(kubelet_socket),
            attempt=attempt,
        )
        return seen
