"""The device health stream (`v1alpha1.DRAResourceHealth/NodeWatchResources`) over real
sockets, read by a raw client on the literal wire path and by the kubelet emulator.

What the kubelet relies on: the complete list at once and on every change, a refresh well
inside the timeout (else devices go Unknown), the stream ending cleanly when the plugin
stops, and the health service advertised after the DRAPlugin versions so a kubelet that
only knows DRAPlugin still registers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from gpuslice.core.dra.health import DeviceHealthReport
from gpuslice.dra.rpc import HEALTH_SERVICE, RegistrationClient, unix_target
from gpuslice.dra.server import DraPluginServer, DraServerSettings
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator
from gpuslice.protos.drahealth.v1alpha1 import api_pb2 as health
from tests.dra.dra_doubles import DRIVER, RecordingPreparer

WIRE_PATH = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
HEALTHY = (
    DeviceHealthReport("node-a", "gpu-0", True),
    DeviceHealthReport("node-a", "gpu-1", True),
)
GPU1_XID = (
    DeviceHealthReport("node-a", "gpu-0", True),
    DeviceHealthReport("node-a", "gpu-1", False, "XID 79 on GPU-1"),
)


class FakeHealth:
    """A HealthSource whose list the test sets; each `set` is a new version."""

    def __init__(self, reports: Sequence[DeviceHealthReport] = HEALTHY) -> None:
        self.version = 1
        self.reports = tuple(reports)
        self._changed = asyncio.Event()

    def current(self) -> tuple[int, Sequence[DeviceHealthReport]]:
        return self.version, self.reports

    def set(self, reports: Sequence[DeviceHealthReport]) -> None:
        self.version += 1
        self.reports = tuple(reports)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_newer(self, version: int) -> None:
        while self.version <= version:
            await self._changed.wait()


@pytest.fixture
def source() -> FakeHealth:
    return FakeHealth()


def _server(
    plugin_dir: Path,
    registry_dir: Path,
    source: FakeHealth | None,
    **settings: object,
) -> DraPluginServer:
    return DraPluginServer(
        DRIVER,
        plugin_dir,
        registry_dir,
        RecordingPreparer(),
        settings=DraServerSettings(check_tick_s=0.5, **settings),  # type: ignore[arg-type]
        health=source,
    )


@pytest.fixture
async def health_server(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth
) -> AsyncIterator[DraPluginServer]:
    async with _server(plugin_dir, registry_dir, source) as running:
        yield running


def _watch(channel: grpc.aio.Channel) -> grpc.aio.UnaryStreamCall:
    call = channel.unary_stream(
        WIRE_PATH,
        request_serializer=health.NodeWatchResourcesRequest.SerializeToString,
        response_deserializer=health.NodeWatchResourcesResponse.FromString,
    )
    return call(health.NodeWatchResourcesRequest())


def _devices(response: health.NodeWatchResourcesResponse) -> list[tuple[str, str, str, str]]:
    return [
        (
            d.device.pool_name,
            d.device.device_name,
            health.HealthStatus.Name(d.health),
            d.message,
        )
        for d in response.devices
    ]


def test_the_service_name_is_the_one_the_kubelet_calls() -> None:
    assert HEALTH_SERVICE == "v1alpha1.DRAResourceHealth"
    assert f"/{HEALTH_SERVICE}/NodeWatchResources" == WIRE_PATH


async def test_stream_sends_the_full_list_at_once_with_timeout_and_time(
    health_server: DraPluginServer,
) -> None:
    async with grpc.aio.insecure_channel(unix_target(str(health_server.dra_socket))) as ch:
        call = _watch(ch)
        first = await asyncio.wait_for(call.read(), 5)
        call.cancel()
    assert _devices(first) == [
        ("node-a", "gpu-0", "HEALTHY", ""),
        ("node-a", "gpu-1", "HEALTHY", ""),
    ]
    for device in first.devices:
        assert device.health_check_timeout_seconds == 30
        assert abs(device.last_updated_time - time.time()) < 5


async def test_a_change_is_sent_at_once(health_server: DraPluginServer, source: FakeHealth) -> None:
    """The refresh is 10 s away: only the change itself can bring the second response."""
    async with grpc.aio.insecure_channel(unix_target(str(health_server.dra_socket))) as ch:
        call = _watch(ch)
        await asyncio.wait_for(call.read(), 5)
        source.set(GPU1_XID)
        second = await asyncio.wait_for(call.read(), 2)
        call.cancel()
    assert _devices(second) == [
        ("node-a", "gpu-0", "HEALTHY", ""),
        ("node-a", "gpu-1", "UNHEALTHY", "XID 79 on GPU-1"),
    ]


async def test_an_unchanged_list_is_sent_again_before_the_timeout(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth
) -> None:
    server = _server(plugin_dir, registry_dir, source, health_timeout_s=2, health_refresh_s=0.2)
    async with server, grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as ch:
        call = _watch(ch)
        responses = [await asyncio.wait_for(call.read(), 2) for _ in range(4)]
        call.cancel()
    assert all(_devices(r) == _devices(responses[0]) for r in responses)
    assert {d.health_check_timeout_seconds for r in responses for d in r.devices} == {2}


def test_a_refresh_slower_than_half_the_timeout_is_refused(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth
) -> None:
    with pytest.raises(ValueError, match="at most half the timeout"):
        _server(plugin_dir, registry_dir, source, health_timeout_s=10, health_refresh_s=6)


async def test_stream_ends_ok_when_the_server_stops(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth
) -> None:
    """Ending with OK (not cut off after the stop grace) is what lets the stop be quick."""
    server = _server(plugin_dir, registry_dir, source, stop_grace_s=5.0)
    await server.start()
    async with grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as ch:
        call = _watch(ch)
        await asyncio.wait_for(call.read(), 5)
        assert server.health is not None
        assert server.health.streams == 1
        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started < 2.0  # not the 5 s grace
        assert await asyncio.wait_for(call.read(), 2) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    assert server.health.streams == 0


async def test_health_is_advertised_after_the_dra_plugin_versions(
    health_server: DraPluginServer,
) -> None:
    target = unix_target(str(health_server.registration_socket))
    async with grpc.aio.insecure_channel(target) as ch:
        info = await RegistrationClient(ch).get_info(timeout_s=5)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]


async def test_without_a_source_health_is_neither_advertised_nor_served(
    server: DraPluginServer,
) -> None:
    async with grpc.aio.insecure_channel(unix_target(str(server.registration_socket))) as ch:
        info = await RegistrationClient(ch).get_info(timeout_s=5)
    assert "v1alpha1.DRAResourceHealth" not in info.supported_versions
    async with grpc.aio.insecure_channel(unix_target(str(server.dra_socket))) as ch:
        call = _watch(ch)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(call.read(), 5)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


# -- the kubelet emulator's side ----------------------------------------------------------


async def test_the_kubelet_sees_health_and_its_changes(
    health_server: DraPluginServer, kubelet: DraKubeletEmulator, source: FakeHealth
) -> None:
    await kubelet.wait_registered(DRIVER)
    seen = await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)
    assert seen == {
        ("node-a", "gpu-0"): ("Healthy", ""),
        ("node-a", "gpu-1"): ("Healthy", ""),
    }
    source.set(GPU1_XID)
    seen = await kubelet.wait_health(
        DRIVER, lambda h: h.get(("node-a", "gpu-1"), ("",))[0] == "Unhealthy"
    )
    assert seen[("node-a", "gpu-1")] == ("Unhealthy", "XID 79 on GPU-1")
    assert seen[("node-a", "gpu-0")] == ("Healthy", "")
    source.set(HEALTHY)
    await kubelet.wait_health(DRIVER, lambda h: set(h.values()) == {("Healthy", "")})


async def test_devices_not_refreshed_within_their_timeout_become_unknown(
    health_server: DraPluginServer, registry_dir: Path
) -> None:
    now = [time.time()]
    async with DraKubeletEmulator(registry_dir, tick_s=0.5, clock=lambda: now[0]) as kubelet:
        await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)
        now[0] += 29
        assert {s for s, _ in kubelet.health(DRIVER).values()} == {"Healthy"}
        now[0] += 5  # past the 30 s the driver gave (its next refresh is 10 s away)
        assert {s for s, _ in kubelet.health(DRIVER).values()} == {"Unknown"}


async def test_an_ended_stream_is_forgotten_then_reopened(
    health_server: DraPluginServer, kubelet: DraKubeletEmulator
) -> None:
    await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)
    assert kubelet.health_streams[DRIVER] == 1
    assert health_server.health is not None
    health_server.health.close()  # ends the open stream (and any opened meanwhile)
    await kubelet.wait_health(DRIVER, lambda h: not h)
    health_server.health.open()
    await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)
    assert kubelet.health_streams[DRIVER] >= 2


async def test_a_kubelet_without_the_gate_registers_and_opens_no_stream(
    health_server: DraPluginServer, registry_dir: Path
) -> None:
    async with DraKubeletEmulator(registry_dir, tick_s=0.5, health_services=()) as kubelet:
        registration = await kubelet.wait_registered(DRIVER)
        assert registration.version == "v1.DRAPlugin"
        await asyncio.sleep(0.3)
        assert kubelet.health_streams.get(DRIVER, 0) == 0
        assert kubelet.health(DRIVER) == {}
    assert health_server.health is not None
    assert health_server.health.sent == 0


async def test_a_kubelet_knowing_only_v1beta1_skips_the_other_services(
    health_server: DraPluginServer, registry_dir: Path
) -> None:
    async with DraKubeletEmulator(
        registry_dir, tick_s=0.5, versions=("v1beta1.DRAPlugin",)
    ) as kubelet:
        registration = await kubelet.wait_registered(DRIVER)
        assert registration.version == "v1beta1.DRAPlugin"
        await kubelet.wait_health(DRIVER, lambda h: len(h) == 2)


async def test_the_emulator_picks_the_dra_version_even_after_the_health_service(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth, kubelet: DraKubeletEmulator
) -> None:
    """The version choice walks the plugin's list and skips services it cannot take as
    the DRA service, whatever their place."""
    server = _server(
        plugin_dir, registry_dir, source, versions=("v1alpha1.DRAResourceHealth", "v1.DRAPlugin")
    )
    async with server:
        registration = await kubelet.wait_registered(DRIVER)
        assert registration.version == "v1.DRAPlugin"


async def test_a_plugin_advertising_only_health_is_rejected(
    plugin_dir: Path, registry_dir: Path, source: FakeHealth, kubelet: DraKubeletEmulator
) -> None:
    server = _server(plugin_dir, registry_dir, source, versions=())
    async with server:
        error = await kubelet.wait_rejected(f"{DRIVER}-reg.sock")
    assert "none of services supported by the plugin" in error
    assert "v1alpha1.DRAResourceHealth" in error
