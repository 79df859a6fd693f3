"""Plugin-watcher registration over real sockets: versions, rejection, sockets' lifecycle."""

from __future__ import annotations

import asyncio
import socket as pysocket
from pathlib import Path

import pytest

from gpuslice.aio.sockets import socket_identity
from gpuslice.dra.server import DraPluginServer, DraServerError, DraServerSettings
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator, DraKubeletError
from gpuslice.testing.eventually import eventually
from tests.dra.dra_doubles import DRIVER, RecordingPreparer, claim, device_for


def _bound_socket(path: Path) -> None:
    """A socket file left by someone else (bound, then its owner went away)."""
    with pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM) as s:
        s.bind(str(path))


def _stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _bound_socket(path)


async def test_registers_with_v1_and_the_real_endpoint(
    server: DraPluginServer, kubelet: DraKubeletEmulator, plugin_dir: Path
) -> None:
    registration = await kubelet.wait_registered(DRIVER)
    assert registration.version == "v1.DRAPlugin"
    assert registration.endpoint == str((plugin_dir / "dra.sock").absolute())
    assert registration.registration_socket.name == f"{DRIVER}-reg.sock"
    await asyncio.wait_for(server.status.registered.wait(), 5)
    assert server.status.accepted is True


async def test_a_v1beta1_only_kubelet_gets_v1beta1(
    server: DraPluginServer, registry_dir: Path
) -> None:
    async with DraKubeletEmulator(registry_dir, versions=("v1beta1.DRAPlugin",)) as old:
        registration = await old.wait_registered(DRIVER)
        assert registration.version == "v1beta1.DRAPlugin"
        results = await old.prepare(DRIVER, [claim("a")])
    expected = device_for("a")
    (device,) = results["a"].devices
    assert device.device == expected.device
    assert device.share_id is None  # v1beta1 cannot carry it


async def test_unsupported_versions_are_rejected_and_the_plugin_sees_it(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer, kubelet: DraKubeletEmulator
) -> None:
    settings = DraServerSettings(versions=("v9.DRAPlugin",))
    async with DraPluginServer(
        DRIVER, plugin_dir, registry_dir, preparer, settings=settings
    ) as server:
        error = await kubelet.wait_rejected(f"{DRIVER}-reg.sock")
        await asyncio.wait_for(server.status.notified.wait(), 5)
        assert server.status.accepted is False
        assert server.status.error == error
        assert "none of services supported by the plugin" in error
        assert "v9.DRAPlugin" in error
        assert not server.status.registered.is_set()
        assert kubelet.registration(DRIVER) is None


async def test_registration_socket_is_recreated_after_deletion(
    server: DraPluginServer, kubelet: DraKubeletEmulator
) -> None:
    await kubelet.wait_registered(DRIVER)
    await asyncio.wait_for(server.status.registered.wait(), 5)
    before = socket_identity(server.registration_socket)
    server.registration_socket.unlink()
    await eventually(
        lambda: socket_identity(server.registration_socket) not in (None, before),
        "the registration socket re-created",
    )
    await asyncio.wait_for(server.status.registered.wait(), 10)  # the kubelet asked again
    await kubelet.wait_registered(DRIVER)
    assert (await kubelet.prepare(DRIVER, [claim("a")]))["a"].error == ""


async def test_stop_removes_only_its_own_sockets(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer
) -> None:
    foreign = registry_dir / "other.example.com-reg.sock"
    _bound_socket(foreign)
    _stale_socket(plugin_dir / "dra.sock")  # stale, from an earlier run of ours
    server = DraPluginServer(DRIVER, plugin_dir, registry_dir, preparer)
    await server.start()
    assert server.dra_socket.exists()
    assert server.registration_socket.exists()
    await server.stop()
    assert not server.dra_socket.exists()
    assert not server.registration_socket.exists()
    assert foreign.exists()


async def test_stop_leaves_a_socket_someone_else_put_in_our_place(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer
) -> None:
    server = DraPluginServer(
        DRIVER, plugin_dir, registry_dir, preparer, settings=DraServerSettings(check_tick_s=60)
    )
    await server.start()
    server.registration_socket.unlink()
    _bound_socket(server.registration_socket)  # a second instance took the name
    replaced = socket_identity(server.registration_socket)
    await asyncio.sleep(0.2)  # let the inotify wake-up look at it: it must not take it over
    await server.stop()
    assert replaced is not None
    assert socket_identity(server.registration_socket) == replaced


async def test_kubelet_restart_re_registers_and_prepare_is_re_driven(
    server: DraPluginServer, kubelet: DraKubeletEmulator, preparer: RecordingPreparer
) -> None:
    await kubelet.wait_registered(DRIVER)
    first = await kubelet.prepare(DRIVER, [claim("a")])
    await kubelet.restart()
    assert kubelet.registration(DRIVER) is None
    await kubelet.wait_registered(DRIVER)
    again = await kubelet.prepare(DRIVER, [claim("a")])  # what a real kubelet re-sends
    assert again == first
    assert preparer.prepare_calls == [["a"], ["a"]]


async def test_plugin_stop_deregisters(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer, kubelet: DraKubeletEmulator
) -> None:
    async with DraPluginServer(DRIVER, plugin_dir, registry_dir, preparer):
        await kubelet.wait_registered(DRIVER)
    await kubelet.wait_unregistered(DRIVER)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("GPU.example.com", "not a DNS subdomain"),
        ("gpu_example", "not a DNS subdomain"),
        ("-gpu.example.com", "not a DNS subdomain"),
        ("a" * 64, "64 characters long"),
    ],
)
def test_bad_driver_names_are_refused(
    name: str, why: str, plugin_dir: Path, registry_dir: Path
) -> None:
    with pytest.raises(DraServerError, match=why):
        DraPluginServer(name, plugin_dir, registry_dir, RecordingPreparer())


async def test_missing_registry_dir_is_a_clear_error(plugin_dir: Path, sock_dir: Path) -> None:
    server = DraPluginServer(DRIVER, plugin_dir, sock_dir / "nope", RecordingPreparer())
    with pytest.raises(DraServerError, match=r"plugin registry directory \S*/nope does not exist"):
        await server.start()


async def test_plugin_restart_is_registered_again(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer, kubelet: DraKubeletEmulator
) -> None:
    stop = asyncio.Event()
    first = asyncio.create_task(
        DraPluginServer(DRIVER, plugin_dir, registry_dir, preparer).run(stop)
    )
    await kubelet.wait_registered(DRIVER)
    stop.set()
    await first
    await kubelet.wait_unregistered(DRIVER)
    async with DraPluginServer(DRIVER, plugin_dir, registry_dir, preparer) as again:
        await kubelet.wait_registered(DRIVER)
        await asyncio.wait_for(again.status.registered.wait(), 5)
        assert (await kubelet.prepare(DRIVER, [claim("a")]))["a"].error == ""


async def test_endpoint_is_what_the_kubelet_is_told(
    plugin_dir: Path, registry_dir: Path, preparer: RecordingPreparer, kubelet: DraKubeletEmulator
) -> None:
    elsewhere = "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
    settings = DraServerSettings(endpoint=elsewhere)
    async with DraPluginServer(DRIVER, plugin_dir, registry_dir, preparer, settings=settings):
        registration = await kubelet.wait_registered(DRIVER)
        assert registration.endpoint == elsewhere
        with pytest.raises(DraKubeletError, match="NodePrepareResources: UNAVAILABLE"):
            await kubelet.prepare(DRIVER, [claim("a")])
    assert preparer.prepare_calls == []
