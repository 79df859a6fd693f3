"""The DRA adapter (`k8s.dra.DraApi`) through lightkube against the API double's
resource.k8s.io/v1: claims read, this node's slices listed by field selector, created with
generateName, replaced with conflict detection, deleted. The double's own rules (scopes,
`/status`, the kubelet's slice wiping) are checked too, since driver tests trust them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from gpuslice.core.jsontypes import Json
from gpuslice.k8s import make_client
from gpuslice.k8s.dra import DraApi
from gpuslice.ports import DraConflict, DraObjectNotFound
from gpuslice.testing.apiserver import FakeApiServer, running_apiserver

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running_apiserver() as server:
        server.add_node("n1")
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[AsyncClient]:
    kube = make_client(api.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
def dra(client: AsyncClient) -> DraApi:
    return DraApi(client, "n1", DRIVER)


def device_class(body: Json) -> DeviceClass:
    """A DeviceClass from its JSON (lightkube types `from_dict` loosely)."""
    return cast(DeviceClass, DeviceClass.from_dict(body))


def status_of(body: Json) -> Any:
    """The claim's status subresource from its JSON (lightkube's `ResourceClaim.Status` is a
    class attribute, which mypy cannot name as a type)."""
    return ResourceClaim.Status.from_dict(body)


def slice_obj(node: str, driver: str = DRIVER) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-00-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def http(api: FakeApiServer, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """A raw request, for what lightkube would not send (wrong scopes, unknown paths)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(api.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


async def test_slices_round_trip_through_lightkube(api: FakeApiServer, dra: DraApi) -> None:
    created = await dra.create_slice(slice_obj("n1"))
    assert created["metadata"]["name"].startswith("n1-gpu.nvidia.com-00-")
    assert len(created["metadata"]["name"]) == len("n1-gpu.nvidia.com-00-") + 5
    await DraApi(dra._client, "n2", DRIVER).create_slice(slice_obj("n2"))
    await DraApi(dra._client, "n1", "other.example.com").create_slice(
        slice_obj("n1", "other.example.com")
    )
    mine = await dra.list_slices()
    assert [s["metadata"]["name"] for s in mine] == [created["metadata"]["name"]]
    assert mine[0]["spec"]["devices"][0]["attributes"] == {"type": {"string": "gpu"}}
    lists = [r for r in api.requests if r.method == "GET" and r.path.endswith("resourceslices")]
    assert lists[-1].query["fieldSelector"] in (
        "spec.nodeName=n1,spec.driver=gpu.nvidia.com",
        "spec.driver=gpu.nvidia.com,spec.nodeName=n1",
    )

    changed = dict(mine[0])
    changed["spec"] = dict(changed["spec"], pool={"name": "n1", "generation": 2,
                                                  "resourceSliceCount": 1})  # fmt: skip
    replaced = await dra.replace_slice(changed)
    assert replaced["spec"]["pool"]["generation"] == 2
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(replaced["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    with pytest.raises(DraConflict, match="modified"):
        await dra.replace_slice(changed)  # the old resourceVersion

    await dra.delete_slice(created["metadata"]["name"])
    assert await dra.list_slices() == []
    assert len(api.resource_slices()) == 2
    with pytest.raises(DraObjectNotFound):
        await dra.delete_slice(created["metadata"]["name"])


async def test_claims_are_read_with_their_status(api: FakeApiServer, dra: DraApi) -> None:
    api.add_claim({"metadata": {"name": "c1", "namespace": "ml"},
                   "spec": {"devices": {"requests": []}}})  # fmt: skip
    api.set_claim_status("ml", "c1", {"allocation": {"devices": {"results": []}}})
    claim = await dra.get_claim("ml", "c1")
    assert claim["metadata"]["uid"] == api.claim("ml", "c1")["metadata"]["uid"]
    assert claim["status"]["allocation"] == {"devices": {"results": []}}
    with pytest.raises(DraObjectNotFound, match="ml/nope"):
        await dra.get_claim("ml", "nope")
    with pytest.raises(DraObjectNotFound):
        await dra.get_claim("other", "c1")  # claims are namespaced
    assert await dra.node_uid() == api.node("n1")["metadata"]["uid"]


async def test_a_claim_recreated_under_the_same_name_has_a_new_uid(
    api: FakeApiServer, dra: DraApi
) -> None:
    """The driver tells a replaced claim from the one it prepared by UID."""
    body: Json = {"metadata": {"name": "c1", "namespace": "ml"}, "spec": {"devices": {}}}
    first = api.add_claim(body)
    assert "uid" not in body["metadata"]  # the caller's object is not written into
    api.delete_claim("ml", "c1")
    second = api.add_claim(body)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert (await dra.get_claim("ml", "c1"))["metadata"]["uid"] == second["metadata"]["uid"]


async def test_claim_status_changes_only_through_the_status_subresource(
    api: FakeApiServer, client: AsyncClient
) -> None:
    api.add_claim({"metadata": {"name": "c1", "namespace": "ml"},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                       "deviceClassName": "gpu.nvidia.com"}}]}}})  # fmt: skip
    claim = await client.get(ResourceClaim, "c1", namespace="ml")
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                                           "pool": "n1", "device": "gpu-0"}]}}  # fmt: skip
    body = claim.to_dict()
    body["status"] = {"allocation": allocation}
    # the main resource (name and namespace from the body), not the status subresource
    ignored = await client.replace(cast(ResourceClaim, ResourceClaim.from_dict(body)))
    assert ignored.status is None or ignored.status.allocation is None
    assert "status" not in api.claim("ml", "c1")

    body = (await client.get(ResourceClaim, "c1", namespace="ml")).to_dict()
    body["status"] = {"allocation": allocation}
    written = await client.replace(status_of(body), "c1", namespace="ml")
    assert written.status.allocation.devices.results[0].device == "gpu-0"
    assert api.claim("ml", "c1")["status"]["allocation"] == allocation

    with pytest.raises(ApiError) as stale:  # the resourceVersion read before the write
        await client.replace(status_of(body), "c1", namespace="ml")
    assert stale.value.status.code == 409


async def test_device_classes_list_get_create(api: FakeApiServer, client: AsyncClient) -> None:
    selector = "device.driver == 'gpu.nvidia.com'"
    api.add_device_class({"metadata": {"name": "gpu.nvidia.com"},
                          "spec": {"selectors": [{"cel": {"expression": selector}}]}})  # fmt: skip
    await client.create(device_class({"metadata": {"name": "mig.nvidia.com"},
                                               "spec": {"selectors": []}}))  # fmt: skip
    names = [c.metadata.name async for c in client.list(DeviceClass) if c.metadata]
    assert names == ["gpu.nvidia.com", "mig.nvidia.com"]
    got = await client.get(DeviceClass, "gpu.nvidia.com")
    assert got.spec is not None
    assert got.spec.selectors is not None
    assert got.spec.selectors[0].cel is not None
    assert got.spec.selectors[0].cel.expression == selector
    assert [c["metadata"]["name"] for c in api.device_classes()] == names
    with pytest.raises(ApiError) as taken:
        await client.create(device_class({"metadata": {"name": "mig.nvidia.com"},
                                                   "spec": {}}))  # fmt: skip
    assert taken.value.status.code == 409


def test_scopes_and_unknown_paths_are_refused(api: FakeApiServer) -> None:
    """A driver bug (a namespaced slice URL, an unsupported selector) must fail here as it
    would against a real API server, not pass on a lenient double."""
    base = "/apis/resource.k8s.io/v1"
    assert http(api, "GET", f"{base}/namespaces/ml/resourceslices")[0] == 404
    assert http(api, "POST", f"{base}/resourceclaims", {"metadata": {"name": "x"}})[0] == 405
    assert http(api, "GET", f"{base}/resourceclaims/x")[0] == 404
    assert http(api, "GET", f"{base}/resourceslices?fieldSelector=spec.pool.name=n1")[0] == 400
    assert http(api, "GET", f"{base}/resourceclaims?watch=true")[0] == 400  # slices only
    assert http(api, "GET", f"{base}/podschedulingcontexts")[0] == 404
    code, body = http(api, "POST", f"{base}/resourceslices", {"metadata": {}, "spec": {}})
    assert (code, body["reason"]) == (422, "Invalid")
    created = http(api, "POST", f"{base}/resourceslices", slice_obj("n1"))[1]
    status_path = f"{base}/resourceslices/{created['metadata']['name']}/status"
    assert http(api, "PUT", status_path, created)[0] == 404
    code, status = http(api, "GET", f"{base}/resourceclaims")
    assert (code, status["kind"], status["items"]) == (200, "ResourceClaimList", [])


def test_the_kubelet_wipes_slices_per_node_and_driver(api: FakeApiServer) -> None:
    base = "/apis/resource.k8s.io/v1/resourceslices"
    for node, driver in [("n1", DRIVER), ("n1", DRIVER), ("n1", "x.example.com"),
                         ("n2", DRIVER)]:  # fmt: skip
        assert http(api, "POST", base, slice_obj(node, driver))[0] == 201
    assert len(api.resource_slices("n1", DRIVER)) == 2
    assert api.delete_all_slices("n1", DRIVER) == 2  # plugin gone for 30 s
    assert [s["spec"]["driver"] for s in api.resource_slices("n1")] == ["x.example.com"]
    assert api.delete_all_slices("n1") == 1  # kubelet start: every driver
    assert api.resource_slices("n1") == []
    remaining = api.resource_slices()
    assert [s["spec"]["nodeName"] for s in remaining] == ["n2"]
    api.delete_slice(remaining[0]["metadata"]["name"])
    assert api.resource_slices() == []
    with pytest.raises(KeyError):
        api.delete_slice(remaining[0]["metadata"]["name"])


async def test_the_claim_list_is_paged_and_keeps_only_the_claims_asked_for(
    api: FakeApiServer, client: AsyncClient
) -> None:
    """The rebuild's cluster-wide LIST: `limit`/`continue` pages, and only the UIDs asked
    for are held, so a large cluster cannot run the agent out of memory."""
    for i in range(25):
        api.add_claim({"metadata": {"name": f"c{i:02d}", "namespace": f"ns{i % 3}"},
                       "spec": {"devices": {"requests": []}}})  # fmt: skip
    uids = {c["metadata"]["uid"]: c["metadata"]["name"] for c in api.claims()}
    wanted = {u for u, name in uids.items() if name in ("c00", "c13", "c24")}
    dra = DraApi(client, "n1", DRIVER, claim_page=10)
    before = len(api.requests)
    got = await dra.list_claims(wanted)
    assert {c["metadata"]["uid"] for c in got} == wanted
    pages = [r for r in api.requests[before:] if r.path.endswith("/resourceclaims")]
    assert [r.query.get("limit") for r in pages] == ["10", "10", "10"]
    assert "continue" not in pages[0].query
    assert all(r.query.get("continue") for r in pages[1:])
    everything = await dra.list_claims()
    assert sorted(c["metadata"]["uid"] for c in everything) == sorted(uids)


async def test_the_claim_list_reads_pages_within_a_byte_bound(
    api: FakeApiServer, client: AsyncClient
) -> None:
    """Any tenant can make large claims (500 of them made a 160 MB page against the chart's
    256Mi): a page over the bound is not read further but asked for again with half the
    claims, so no page read is larger than the bound and every wanted claim still comes."""
    for i in range(12):
        api.add_claim({"metadata": {"name": f"big{i:02d}", "namespace": "ml",
                                    "annotations": {"pad": "x" * 10_000}},
                       "spec": {"devices": {"requests": []}}})  # fmt: skip
    uids = {c["metadata"]["uid"] for c in api.claims()}
    dra = DraApi(client, "n1", DRIVER, claim_page=8, claim_page_bytes=45_000)
    before = len(api.requests)
    got = await dra.list_claims(uids)
    assert {c["metadata"]["uid"] for c in got} == uids
    assert 0 < dra.largest_page_read <= 45_000
    pages = [r for r in api.requests[before:] if r.path.endswith("/resourceclaims")]
    assert [r.query.get("limit") for r in pages][:2] == ["8", "4"]


def test_the_double_pages_lists_as_the_api_does(api: FakeApiServer) -> None:
    for i in range(5):
        api.add_claim({"metadata": {"name": f"c{i}", "namespace": "ml"},
                       "spec": {"devices": {"requests": []}}})  # fmt: skip
    claims = "/apis/resource.k8s.io/v1/resourceclaims"
    code, first = http(api, "GET", f"{claims}?limit=2")
    assert code == 200
    assert [c["metadata"]["name"] for c in first["items"]] == ["c0", "c1"]
    assert first["metadata"]["remainingItemCount"] == 3
    code, second = http(api, "GET", f"{claims}?limit=2&continue={first['metadata']['continue']}")
    assert [c["metadata"]["name"] for c in second["items"]] == ["c2", "c3"]
    code, last = http(api, "GET", f"{claims}?limit=2&continue={second['metadata']['continue']}")
    assert [c["metadata"]["name"] for c in last["items"]] == ["c4"]
    assert "continue" not in last["metadata"]
    code, _ = http(api, "GET", f"{claims}?continue=not-a-token")
    assert code == 400
