"""Dynamic MIG against the real kube-apiserver and kube-scheduler (1.36, partitionable
devices on by default): the server takes the slices a dynamic GPU publishes (counter sets in
slices of their own, at most 64 devices per slice), and the scheduler, counting the counters,
allocates exactly the MIG devices that fit together on the GPU.

No kubelet runs: claims are created directly and reserved by pods the scheduler only binds
(as in `test_claims_by_the_real_scheduler`). Every test has a Node of its own, selected by
its pods' label, so no claim lands on another test's devices."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml
from lightkube import ApiError, AsyncClient

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.agent.dynamic_mig import JOURNAL_NAME, DynamicMig
from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.partition import created
from gpuslice.core.config import parse_config
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.partitions import dynamic_gpu
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.plan import build_plan
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.state import PlanState, Snapshot
from gpuslice.testing import envtest
from gpuslice.whatif.claims import DEFAULT_DEVICE_CLASSES, what_if
from tests.mig_guide import NVIDIA_TABLES

DRIVER = "gpu.nvidia.com"
NAMESPACE = "dynmig"
NODE_LABEL = "gpuslice.test/node"


def create(plane: envtest.ControlPlane, obj: Json) -> None:
    done = plane.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(obj))
    assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr


def _class(name: str, kind: str) -> Json:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


@pytest.fixture(scope="module")
def plane(control_plane: envtest.ControlPlane) -> envtest.ControlPlane:
    if not control_plane.scheduler:
        pytest.skip(f"no kube-scheduler in {envtest.ASSETS_ENV}")
    for obj in (_class("gpu.nvidia.com", "gpu"), _class("mig.nvidia.com", "mig")):
        create(control_plane, obj)
    create(
        control_plane, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    create(control_plane, {"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "default", "namespace": NAMESPACE}})  # fmt: skip
    return control_plane


@dataclass
class Node:
    """A Node of the shared plane with a simulated GPU backend, its agent's publisher
    (every GPU marked dynamic) and, on demand, its DRA driver."""

    plane: envtest.ControlPlane
    name: str
    api: DraApi
    backend: SimulatedBackend
    workdir: Path
    dynamic: DynamicMig = field(init=False)
    publisher: SlicePublisher = field(init=False)

    def __post_init__(self) -> None:
        self.dynamic = DynamicMig(self.backend, CheckpointFile(self.workdir / JOURNAL_NAME), "boot")
        self.publisher = SlicePublisher(
            self.api,
            driver=DRIVER,
            node=self.name,
            snapshot=self.snapshot,
            dynamic=lambda: {"all"},
            ours=self.dynamic.ours,
        )

    def snapshot(self) -> Snapshot:
        inventory = self.backend.inventory()
        return PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory).current

    async def publish(self) -> list[Json]:
        await self.publisher.publish_once()
        return await self.api.list_slices()

    def driver(self) -> DraDriver:
        return DraDriver(
            DriverSettings(DRIVER, self.name, mps_root=str(self.workdir / "mps")),
            objects=self.api,
            checkpoint=CheckpointFile(self.workdir / "checkpoint.json"),
            cdi=CdiSpecStore(self.workdir / "cdi", CDI_KIND),
            snapshot=self.snapshot,
            boot_id="boot",
            dynamic_mig=self.dynamic,
            dynamic=lambda: {"all"},
        )

    async def ref(self, name: str) -> ClaimRef:
        obj = await self.api.get_claim(NAMESPACE, f"{self.name}-{name}")
        return ClaimRef(NAMESPACE, obj["metadata"]["uid"], f"{self.name}-{name}")

    def claim(self, name: str, profile: str | None = None, cls: str = "mig.nvidia.com") -> None:
        request: Json = {"deviceClassName": cls}
        if profile is not None:
            expression = f"device.attributes['{DRIVER}'].profile == '{profile}'"
            request["selectors"] = [{"cel": {"expression": expression}}]
        create(self.plane, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{self.name}-{name}", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        })  # fmt: skip
        spec: Json = {
            "nodeSelector": {NODE_LABEL: self.name},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{self.name}-{name}"}],
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        }  # fmt: skip
        meta = {"name": f"{self.name}-{name}", "namespace": NAMESPACE}
        create(self.plane, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})

    def delete(self, name: str) -> None:
        """Delete claim `name` and its pod, and do what the controller-manager (not run
        here) would: deallocate the claim and let it go, which gives back its counters."""
        full = f"{self.name}-{name}"
        done = self.plane.kubectl(
            "delete", "pod", "-n", NAMESPACE, full, "--wait=false", "--grace-period=0", "--force"
        )
        assert done.returncode == 0, done.stderr
        for args in (
            ("--subresource=status", "-p", '{"status":{"allocation":null,"reservedFor":null}}'),
            ("-p", '{"metadata":{"finalizers":null}}'),
        ):
            done = self.plane.kubectl(
                "patch", "resourceclaim", "-n", NAMESPACE, full, "--type=merge", *args
            )
            assert done.returncode == 0, done.stderr
        done = self.plane.kubectl("delete", "resourceclaim", "-n", NAMESPACE, full)
        assert done.returncode == 0, done.stderr

    async def device(self, name: str) -> str:
        """The device the scheduler allocated to claim `name`."""
        async with asyncio.timeout(30):
            while True:
                obj = await self.api.get_claim(NAMESPACE, f"{self.name}-{name}")
                allocation = (obj.get("status") or {}).get("allocation")
                if allocation:
                    [result] = allocation["devices"]["results"]
                    return str(result["device"])
                await asyncio.sleep(0.1)

    async def unschedulable(self, name: str) -> str:
        async with asyncio.timeout(30):
            while True:
                done = self.plane.kubectl(
                    "get", "pod", "-n", NAMESPACE, f"{self.name}-{name}", "-o", "json"
                )
                assert done.returncode == 0, done.stderr
                for cond in (json.loads(done.stdout).get("status") or {}).get("conditions") or ():
                    if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                        return str(cond.get("message", ""))
                await asyncio.sleep(0.1)


_NODES = itertools.count()


@pytest.fixture
async def make_node(
    plane: envtest.ControlPlane, sock_dir: Path
) -> AsyncIterator[Callable[[str], Awaitable[Node]]]:
    clients: list[AsyncClient] = []

    async def make(spec: str) -> Node:
        workdir = sock_dir / f"n{len(clients)}"
        workdir.mkdir()
        name = f"dynmig-{next(_NODES)}"
        create(plane, {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": {NODE_LABEL: name}}})  # fmt: skip
        status = {"status": {"allocatable": {"pods": "20", "cpu": "8", "memory": "16Gi"},
                             "capacity": {"pods": "20", "cpu": "8", "memory": "16Gi"}}}  # fmt: skip
        patched = plane.kubectl(
            "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )
        assert patched.returncode == 0, patched.stderr
        backend = open_backend(spec)
        assert isinstance(backend, SimulatedBackend)
        client = make_client(plane.kubeconfig, trust_env=False)
        clients.append(client)
        node = Node(plane, name, DraApi(client, name, DRIVER), backend, workdir)
        await node.dynamic.load(set())
        return node

    try:
        yield make
    finally:
        for client in clients:
            await client.close()


async def test_eight_dynamic_h100s_are_taken_as_published(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """200 devices and 8 counter sets: four device slices of at most 64, one counter slice;
    what the server stores reads back as published, so a second publish writes nothing."""
    node = await make_node("sim:8xh100-80gb/mig=")
    stored = await node.publish()
    devices = [s for s in stored if s["spec"].get("devices")]
    counters = [s for s in stored if s["spec"].get("sharedCounters")]
    assert [len(s["spec"]["devices"]) for s in devices] == [64, 64, 64, 8]
    assert [len(s["spec"]["sharedCounters"]) for s in counters] == [8]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {5}
    assert (await node.publisher.publish_once()).empty
    assert await node.api.list_slices() == stored


async def test_seven_1g_claims_fit_an_h100_and_the_eighth_waits(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    for i in range(8):
        node.claim(f"c{i}", "1g.10gb")
    got = []
    for i in range(7):
        got.append(await node.device(f"c{i}"))
    assert sorted(got) == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    message = await node.unschedulable("c7")
    assert "cannot allocate all claims" in message or "resourceclaim" in message.lower(), message

    node.delete("c3")  # its counters come back: the eighth gets the freed placement
    assert await node.device("c7") == got[3]


async def test_a_4g_and_a_3g_fit_together(make_node: Callable[[str], Awaitable[Node]]) -> None:
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    node.claim("big", "4g.40gb")
    node.claim("half", "3g.40gb")
    assert await node.device("big") == "gpu-0-mig-4g40gb-5-0"
    assert await node.device("half") == "gpu-0-mig-3g40gb-9-4"
    node.claim("more", "1g.10gb")  # nothing is left: 7 of 7 compute slices, 8 of 8 memory
    await node.unschedulable("more")


async def test_a_dynamic_gpu_is_never_allocated_whole(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """In MIG mode CUDA runs only in MIG devices: a whole-GPU claim stays pending on a GPU
    with nothing allocated, and MIG claims are allocated beside it (NVIDIA's driver offers
    no GPU whole whose MIG mode it cannot turn off; gpuslice never turns it off)."""
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    node.claim("whole", cls="gpu.nvidia.com")
    await node.unschedulable("whole")
    node.claim("small", "1g.10gb")
    assert await node.device("small") == "gpu-0-mig-1g10gb-19-0"


async def test_prepare_creates_the_allocated_instance_and_unprepare_destroys_it(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """The scheduler picks the placement; the driver creates exactly that MIG device,
    hands its CDI spec to the kubelet, and destroys it at Unprepare, which frees the
    placement for the next claim."""
    node = await make_node("sim:1xh100-80gb/mig=")
    await node.publish()
    node.claim("a", "3g.40gb")
    device = await node.device("a")
    assert device == "gpu-0-mig-3g40gb-9-0"
    driver = node.driver()
    await driver.load()
    ref = await node.ref("a")
    result = (await driver.prepare([ref]))[ref.uid]
    assert result.error == ""
    [mig] = node.backend.inventory().gpus[0].mig_devices
    assert (mig.profile, mig.placement_start) == ("3g.40gb", 0)
    spec = yaml.safe_load(
        (node.workdir / "cdi" / f"k8s.gpuslice.io-claim_{ref.uid}.yaml").read_text()
    )
    [entry] = spec["devices"]
    assert f"NVIDIA_VISIBLE_DEVICES={mig.uuid}" in entry["containerEdits"]["env"]
    assert any("nvidia-caps" in n["path"] for n in entry["containerEdits"]["deviceNodes"])
    # the slices do not change while the instance exists: no republish per claim
    assert (await node.publisher.publish_once()).empty

    assert await driver.unprepare([ref]) == {ref.uid: ""}
    assert node.backend.inventory().gpus[0].mig_devices == ()
    node.delete("a")
    node.claim("b", "4g.40gb")  # the freed placement is the 4g's
    assert await node.device("b") == "gpu-0-mig-4g40gb-5-0"


async def test_someone_elses_instance_takes_its_placements_out(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """An operator's 4g.40gb on the GPU: the whole GPU and every partition it overlaps
    leave the slices, its counters are taken out, and a 4g claim waits while a 3g fits."""
    node = await make_node("sim:1xh100-80gb/mig=")
    node.backend.create_mig(node.backend.inventory().gpus[0].uuid, "4g.40gb", 0)
    await node.publish()
    node.claim("whole", cls="gpu.nvidia.com")
    node.claim("four", "4g.40gb")
    node.claim("three", "3g.40gb")
    assert await node.device("three") == "gpu-0-mig-3g40gb-9-4"
    await node.unschedulable("whole")
    await node.unschedulable("four")


def _slice(node: str, spec: Json) -> Json:
    pool = {"name": f"{node}-limits", "generation": 1, "resourceSliceCount": 1}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-limits-"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, **spec},
    }


def _consumer(i: int, counters: int = 1) -> Json:
    values = {f"c{k}": {"value": "1"} for k in range(counters)}
    return {"name": f"d{i}", "consumesCounters": [{"counterSet": "s", "counters": values}]}


@pytest.mark.parametrize(
    ("what", "spec", "accepted"),
    [
        ("64 consuming devices", {"devices": [_consumer(i) for i in range(64)]}, True),
        ("65 consuming devices", {"devices": [_consumer(i) for i in range(65)]}, False),
        ("32 counters per consumption", {"devices": [_consumer(0, 32)]}, True),
        ("33 counters per consumption", {"devices": [_consumer(0, 33)]}, False),
        (
            "devices and counter sets in one slice",
            {
                "devices": [_consumer(0)],
                "sharedCounters": [{"name": "s", "counters": {"c0": {"value": "1"}}}],
            },
            False,
        ),
        (
            "9 counter sets",
            {
                "sharedCounters": [
                    {"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)
                ]
            },
            False,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_the_limits_the_publisher_keeps_are_the_servers(
    make_node: Callable[[str], Awaitable[Node]], what: str, spec: Json, accepted: bool
) -> None:
    """What `publish.slice_specs` and `partitions` hold to, checked against the real server:
    one side of each limit is taken, the other refused."""
    node = await make_node("sim:1xh100-80gb/mig=")
    if accepted:
        await node.api.create_slice(_slice(node.name, spec))
        return
    with pytest.raises(ApiError) as err:
        await node.api.create_slice(_slice(node.name, spec))
    assert err.value.status.code == 422, what


def profile_claim(name: str, profile: str) -> Json:
    expression = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    selectors = [{"cel": {"expression": expression}}]
    request = {"deviceClassName": "mig.nvidia.com", "selectors": selectors}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


class CountingApi(DraApi):
    """The real API, counting this node's slice writes; `spoil` empties every counter set
    written (what the publisher sent before a filled GPU's set was left out), so the server
    refuses those slices as it did then."""

    def __init__(self, client: AsyncClient, node: str, *, spoil: bool = False) -> None:
        super().__init__(client, node, DRIVER)
        self.spoil = spoil
        self.writes = 0
        self.refused: list[float] = []
        """When each refused write was answered (monotonic seconds)."""
        self.refusals = asyncio.Event()

    async def _write(self, obj: Json, send: Callable[[Json], Awaitable[Json]]) -> Json:
        self.writes += 1
        if self.spoil and obj["spec"].get("sharedCounters"):
            sets = [{**s, "counters": {}} for s in obj["spec"]["sharedCounters"]]
            obj = {**obj, "spec": {**obj["spec"], "sharedCounters": sets}}
        try:
            return await send(obj)
        except Exception:
            self.refused.append(time.monotonic())
            self.refusals.set()
            raise

    async def create_slice(self, obj: Json) -> Json:
        return await self._write(obj, super().create_slice)

    async def replace_slice(self, obj: Json) -> Json:
        return await self._write(obj, super().replace_slice)

    async def delete_slice(self, name: str) -> None:
        self.writes += 1
        await super().delete_slice(name)


async def test_a_gpu_someone_else_filled_blocks_no_other_gpu(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """An operator's 7g fills GPU 0: its counter set would be empty, which the server
    refuses, and with it the node's whole pool. It publishes nothing; GPU 1's partitions
    are taken in one round of writes (one device slice, one counter slice), a claim gets
    one, and at rest nothing more is written."""
    node = await make_node("sim:2xh100-80gb/mig=")
    node.backend.create_mig(node.backend.inventory().gpus[0].uuid, "7g.80gb", 0)
    api = CountingApi(node.api._client, node.name)
    node.publisher = SlicePublisher(
        api,
        driver=DRIVER,
        node=node.name,
        snapshot=node.snapshot,
        dynamic=lambda: {"all"},
        ours=node.dynamic.ours,
    )
    stored = await node.publish()
    assert api.writes == 2
    assert api.refused == []
    [counters] = [s for s in stored if s["spec"].get("sharedCounters")]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-1-counter-set"]
    devices = {d["name"] for s in stored for d in s["spec"].get("devices") or ()}
    assert len(devices) == 25
    assert all(name.startswith("gpu-1-mig-") for name in devices)
    node.claim("seven", "7g.80gb")
    assert await node.device("seven") == "gpu-1-mig-7g80gb-0-0"
    assert (await node.publisher.publish_once()).empty
    assert api.writes == 2


async def test_refused_slices_are_retried_with_back_off_not_at_the_echos_pace(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """Slices the server refuses (here: counter sets emptied on the way, as a filled GPU's
    once were) are retried after the publisher's back-off (0.2 s, doubling), not each time
    the watch echoes the slices written before the refused one: that echo made 7 to 41
    requests a second."""
    node = await make_node("sim:1xh100-80gb/mig=")
    api = CountingApi(node.api._client, node.name, spoil=True)
    inventory = node.backend.inventory()
    state = PlanState(build_plan(inventory, parse_config("version: v1\n")), inventory)
    publisher = SlicePublisher(
        api,
        driver=DRIVER,
        node=node.name,
        snapshot=lambda: state.current,
        dynamic=lambda: {"all"},
        ours=node.dynamic.ours,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(publisher.run(stop, state))
    try:
        async with asyncio.timeout(30):
            while len(api.refused) < 4:
                api.refusals.clear()
                await api.refusals.wait()
    finally:
        stop.set()
        await running
    gaps = [b - a for a, b in itertools.pairwise(api.refused[:4])]
    # after failure k the next try waits 0.2 * 2**(k-1) s: 0.2, 0.4, 0.8
    assert all(gap >= 0.9 * 0.2 * 2**k for k, gap in enumerate(gaps)), gaps
    # each try rewrites the device slice and is refused at the counter slice: two writes
    assert api.writes <= 2 * len(api.refused) + 2, (api.writes, len(api.refused))


async def test_someone_elses_me_instance_leaves_a_pool_the_scheduler_takes(
    make_node: Callable[[str], Awaitable[Node]],
) -> None:
    """An operator's `1g.10gb+me` holds the GPU's one OFA unit: the `+me` partitions (and the
    7g, which needs it too) are not published, so no device consumes a counter its set no
    longer has (the scheduler then calls the whole pool invalid and allocates nothing). A
    `1g.10gb` claim is allocated, a `+me` one waits, and `describe --claims` says the same."""
    node = await make_node("sim:1xh100-80gb/mig=")
    node.backend.create_mig(node.backend.inventory().gpus[0].uuid, "1g.10gb+me", 0)
    stored = await node.publish()
    [counters] = [s for s in stored if s["spec"].get("sharedCounters")]
    assert "ofa-engines" not in counters["spec"]["sharedCounters"][0]["counters"]
    node.claim("plain", "1g.10gb")
    node.claim("me", "1g.10gb+me")
    assert await node.device("plain") == "gpu-0-mig-1g10gb-19-1"
    await node.unschedulable("me")

    inventory = node.backend.inventory()
    claims = [profile_claim(n, p) for n, p in (("plain", "1g.10gb"), ("me", "1g.10gb+me"))]
    report = what_if(
        inventory,
        build_plan(inventory, parse_config("version: v1\n")),
        claims,
        DEFAULT_DEVICE_CLASSES,
        driver=DRIVER,
        pool=node.name,
        dynamic=("all",),
    )
    plain, me = report.claims
    assert plain.fits
    assert [d.device for d in plain.devices] == ["gpu-0-mig-1g10gb-19-1"]
    assert not me.fits


def _combinations() -> list[tuple[str, str, list[str], int]]:
    """Per MIG model, from NVIDIA's table (`tests.mig_guide`): claims in order, and how many
    of them (the first ones) the GPU holds together; the rest must wait."""
    out = []
    for model, rows in sorted(NVIDIA_TABLES.items()):
        small = rows[0][0]
        count = rows[0][8]
        full = rows[-1][0]  # the profile spanning every memory slice
        mes = [r[0] for r in rows if r[0].endswith("+me")]
        out.append((model, f"{count} {small} and one more", [small] * (count + 1), count))
        out.append((model, "two +me: one OFA unit", [mes[0], mes[-1]], 1))
        out.append((model, f"{full} then {small}", [full, small], 1))
        if model == "a30":
            out.append((model, "2g, 2g+me, then 1g", ["2g.12gb", "2g.12gb+me", small], 2))
        else:
            four, three = (r[0] for r in rows if r[0][0] in "43" and "+" not in r[0])
            out.append((model, f"{four}, {three}, then {small}", [three, four, small], 2))
    return out


@pytest.mark.parametrize(
    ("model", "what", "profiles", "held"),
    _combinations(),
    ids=[f"{c[0]}: {c[1]}" for c in _combinations()],
)
async def test_each_models_valid_and_invalid_combinations_by_the_real_scheduler(
    make_node: Callable[[str], Awaitable[Node]],
    model: str,
    what: str,
    profiles: list[str],
    held: int,
) -> None:
    """What the real scheduler allocates together from the published counters is what
    NVIDIA's table lets the GPU hold: the first `held` claims get devices named with the
    table's profile IDs, which the driver (the simulator, with the MIG User Guide's rules)
    creates together; the next one waits."""
    node = await make_node(f"sim:1x{model}/mig=")
    await node.publish()
    for i, profile in enumerate(profiles):
        node.claim(f"c{i}", profile)
    got = [await node.device(f"c{i}") for i in range(held)]
    for i in range(held, len(profiles)):
        await node.unschedulable(f"c{i}")
    inventory = node.backend.inventory()
    gpu = inventory.gpus[0]
    parts = dynamic_gpu(gpu, inventory).partitions
    assert [parts[name].profile.name for name in got] == profiles[:held]
    ids = {row[0]: row[1] for row in NVIDIA_TABLES[model]}
    for name in got:
        profile = parts[name].profile.name
        spelled = profile.replace(".", "").replace("+", "-")
        assert name == f"gpu-0-mig-{spelled}-{ids[profile]}-{parts[name].start}"
    for serial, name in enumerate(got):  # the GPU creates them together
        mig = created(gpu, parts[name].profile.name, parts[name].start, serial)
        gpu = replace(gpu, mig_devices=(*gpu.mig_devices, mig))
