"""The emulated kubelet rejects answers that break the DRA contract, as the kubelet does.

The gpuslice servicer never sends such answers, so a deliberately broken DRA service is
served here (registration and DRA on one socket) to prove the emulator would notice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gpuslice.dra.registration import RegistrationServicer, RegistrationStatus
from gpuslice.dra.rpc import SUPPORTED_VERSIONS, dra_handlers, registration_handler, unix_target
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator, DraKubeletError
from gpuslice.logs import get_logger
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1
from tests.dra.dra_doubles import claim

BROKEN = "broken.example.com"


class BrokenDra:
    """Answers only the first claim, and adds one nobody asked for when told to."""

    def __init__(self) -> None:
        self.add_unknown = False

    async def prepare_v1(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        out = v1.NodePrepareResourcesResponse()
        out.claims[request.claims[0].uid].error = ""
        if self.add_unknown:
            out.claims["stranger"].error = ""
        return out

    async def unprepare_v1(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        return v1.NodeUnprepareResourcesResponse()

    async def prepare_v1beta1(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        return v1beta1.NodePrepareResourcesResponse()

    async def unprepare_v1beta1(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        return v1beta1.NodeUnprepareResourcesResponse()


@pytest.fixture
async def broken(registry_dir: Path) -> AsyncIterator[BrokenDra]:
    socket = registry_dir / f"{BROKEN}-reg.sock"
    service = BrokenDra()
    registration = RegistrationServicer(
        BROKEN,
        str(socket),
        SUPPORTED_VERSIONS,
        status=RegistrationStatus(),
        logger=get_logger("test.dra"),
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((registration_handler(registration), *dra_handlers(service)))
    server.add_insecure_port(unix_target(str(socket)))
    await server.start()
    try:
        yield service
    finally:
        await server.stop(0)


async def test_skipped_claims_are_a_kubelet_error(
    broken: BrokenDra, kubelet: DraKubeletEmulator
) -> None:
    await kubelet.wait_registered(BROKEN)
    assert (await kubelet.prepare(BROKEN, [claim("a")]))["a"].error == ""
    with pytest.raises(DraKubeletError, match="NodePrepareResources skipped 2 ResourceClaims"):
        await kubelet.prepare(BROKEN, [claim("a"), claim("b"), claim("c")])
    with pytest.raises(DraKubeletError, match="NodeUnprepareResources skipped 1 ResourceClaims"):
        await kubelet.unprepare(BROKEN, [claim("a")])


async def test_unknown_claim_uid_is_a_kubelet_error(
    broken: BrokenDra, kubelet: DraKubeletEmulator
) -> None:
    broken.add_unknown = True
    await kubelet.wait_registered(BROKEN)
    with pytest.raises(DraKubeletError, match="result for unknown claim UID stranger"):
        await kubelet.prepare(BROKEN, [claim("a")])
