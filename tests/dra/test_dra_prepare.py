"""NodePrepareResources / NodeUnprepareResources over real sockets: both versions, the contract."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest

from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.dra.convert import claims_to_v1, claims_to_v1beta1
from gpuslice.dra.rpc import DraClientV1, DraClientV1beta1, unix_target
from gpuslice.dra.server import DraPluginServer
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1
from tests.dra.dra_doubles import DRIVER, RecordingPreparer, claim, device_for


async def test_v1_and_v1beta1_both_answer_on_one_socket(server: DraPluginServer) -> None:
    async with grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as channel:
        new = await DraClientV1(channel).prepare(
            v1.NodePrepareResourcesRequest(claims=claims_to_v1([claim("a")])), timeout_s=5
        )
        old = await DraClientV1beta1(channel).prepare(
            v1beta1.NodePrepareResourcesRequest(claims=claims_to_v1beta1([claim("b")])),
            timeout_s=5,
        )
    device_v1 = new.claims["a"].devices[0]
    assert (device_v1.pool_name, device_v1.device_name) == ("node-a", "gpu-a")
    assert list(device_v1.cdi_device_ids) == ["k8s.gpu.example.com/claim=a"]
    assert device_v1.share_id == "share-a"
    device_b = old.claims["b"].devices[0]
    assert device_b.device_name == "gpu-b"
    assert list(device_b.request_names) == ["gpu"]
    assert "share_id" not in v1beta1.Device.DESCRIPTOR.fields_by_name


async def test_emulator_prepares_through_v1(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    await kubelet.wait_registered(DRIVER)
    results = await kubelet.prepare(DRIVER, [claim("a"), claim("b")])
    assert results["a"].devices == (device_for("a"),)  # share_id survives v1
    assert results["b"].error == ""
    assert preparer.prepare_calls == [["a", "b"]]


async def test_one_failing_claim_does_not_fail_the_others(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    preparer.fail_uids = {"b"}
    await kubelet.wait_registered(DRIVER)
    results = await kubelet.prepare(DRIVER, [claim("a"), claim("b"), claim("c")])
    assert results["a"].devices == (device_for("a"),)
    assert results["c"].devices == (device_for("c"),)
    assert results["b"].devices == ()
    assert "cannot prepare b" in results["b"].error
    assert "\n" not in results["b"].error  # escaped before it reaches the kubelet
    assert set(preparer.prepared) == {"a", "c"}


async def test_claim_the_preparer_left_out_gets_an_error(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    preparer.skip_uids = {"b"}
    await kubelet.wait_registered(DRIVER)
    results = await kubelet.prepare(DRIVER, [claim("a"), claim("b")])
    assert results["a"].error == ""
    assert results["b"].error == "gpuslice did not prepare claim b"
    errors = await kubelet.unprepare(DRIVER, [claim("a"), claim("b")])
    assert errors == {"a": "", "b": "gpuslice did not unprepare claim b"}


async def test_malformed_claims_get_their_own_error(
    server: DraPluginServer, preparer: RecordingPreparer
) -> None:
    claims = [
        ClaimRef("default", "", "no-uid"),
        ClaimRef("default", "dup", "one"),
        ClaimRef("default", "dup", "two"),
        ClaimRef("default", "long", "x" * 300),
        ClaimRef("default", "u" * 500, "long-uid"),
        claim("ok"),
    ]
    async with grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as channel:
        response = await DraClientV1(channel).prepare(
            v1.NodePrepareResourcesRequest(claims=claims_to_v1(claims)), timeout_s=5
        )
    errors = {uid: entry.error for uid, entry in response.claims.items()}
    assert errors[""] == "claim has an empty uid"
    assert "appears 2 times" in errors["dup"]
    assert "name" in errors["long"]
    assert "253" in errors["long"]
    assert "longer than 128" in errors["u" * 500]
    assert len(errors["u" * 500]) < 200  # the UID is not echoed whole
    assert errors["ok"] == ""
    assert preparer.prepare_calls == [["ok"]]


async def test_unprepare_is_idempotent(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    await kubelet.wait_registered(DRIVER)
    await kubelet.prepare(DRIVER, [claim("a")])
    assert set(preparer.prepared) == {"a"}
    assert await kubelet.unprepare(DRIVER, [claim("a")]) == {"a": ""}
    assert await kubelet.unprepare(DRIVER, [claim("a")]) == {"a": ""}
    assert await kubelet.unprepare(DRIVER, [claim("never")]) == {"never": ""}
    assert preparer.prepared == {}
    assert len(preparer.unprepare_calls) == 3


async def test_unprepare_exception_is_a_per_claim_error(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    async def broken(claims: object) -> dict[str, str]:
        raise OSError("disk gone")

    preparer.unprepare = broken  # type: ignore[method-assign]
    await kubelet.wait_registered(DRIVER)
    errors = await kubelet.unprepare(DRIVER, [claim("a")])
    assert errors == {"a": "unprepare failed: disk gone"}


async def test_unregistered_driver_is_a_kubelet_error(kubelet: DraKubeletEmulator) -> None:
    from gpuslice.emulator.dra_kubelet import DraKubeletError

    with pytest.raises(DraKubeletError, match="not registered"):
        await kubelet.prepare("nobody.example.com", [claim("a")])


async def test_a_preparer_answering_nonsense_fails_claims_not_the_call(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    async def nonsense(claims: Sequence[ClaimRef]) -> object:
        return {c.uid: None for c in claims} if len(claims) == 1 else 42

    preparer.prepare = nonsense  # type: ignore[assignment,method-assign]
    await kubelet.wait_registered(DRIVER)
    results = await kubelet.prepare(DRIVER, [claim("a"), claim("b")])
    assert set(results) == {"a", "b"}
    for result in results.values():
        assert result.error == "prepare failed: the preparer answered NoneType, not a PrepareResult"
