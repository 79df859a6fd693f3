"""The record rebuild's cluster-wide claim LIST against a real kube-apiserver, with a tenant's
nesting bomb among the claims: 3 KB of opaque parameters 1,500 arrays deep, for a driver that
is not ours, which the API server accepts and serves. Only the real server here: the API
double encodes with Python's `json`, which cannot write such a claim either.

The bomb is made on the plane of the restarting tests (`own_control_plane`) and deleted at
the end, so no other test's LIST meets it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpuslice.k8s import make_client
from gpuslice.k8s.dra import ClaimUnreadable, DraApi
from gpuslice.testing import envtest
from gpuslice.testing.logcapture import captured_events

DRIVER = "gpu.nvidia.com"
NAMESPACE = "tenant-bomb"
DEPTH = 1500


def claim(name: str, parameters: str = '{"kind": "GpuConfig"}') -> str:
    """A claim's JSON, its opaque parameters given as JSON text (the bomb cannot be built as
    a Python object and encoded: the encoder recurses too)."""
    opaque = {"driver": "other.example.com", "parameters": "PARAMETERS"}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "r", "exactly": {"deviceClassName": "other.example.com"}}],
            "config": [{"opaque": opaque}]}},
    }  # fmt: skip
    return json.dumps(body).replace('"PARAMETERS"', parameters)


@pytest.fixture
def plane(own_control_plane: envtest.ControlPlane) -> Iterator[envtest.ControlPlane]:
    made = own_control_plane.kubectl("create", "namespace", NAMESPACE)
    assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
    try:
        yield own_control_plane
    finally:
        own_control_plane.kubectl("delete", "resourceclaims", "--all", "-n", NAMESPACE)


def create(plane: envtest.ControlPlane, text: str) -> str:
    out = "jsonpath={.metadata.uid}"
    done = plane.kubectl("create", "--validate=false", "-o", out, "-f", "-", stdin=text)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_a_nesting_bomb_in_another_claim_costs_only_itself(
    plane: envtest.ControlPlane,
) -> None:
    """One unreadable claim fails neither the page it is in nor the rebuild: the wanted
    claims around it are read, the bomb is skipped and named in the log; asked for by its
    own UID it is an error, never silently taken for absent."""
    bomb = '{"x": ' + "[" * DEPTH + "]" * DEPTH + "}"
    assert len(bomb) > 3000
    uids = {name: create(plane, claim(name)) for name in ("a0", "a1")}
    uids["bomb"] = create(plane, claim("bomb", bomb))
    uids.update({name: create(plane, claim(name)) for name in ("c0", "c1")})
    client = make_client(plane.kubeconfig, trust_env=False)
    try:
        dra = DraApi(client, "n1", DRIVER, claim_page=2)  # the bomb shares a page
        wanted = {uids["a1"], uids["c0"], uids["c1"]}
        with captured_events() as logs:
            got = await dra.list_claims(wanted)
        assert {c["metadata"]["uid"] for c in got} == wanted
        [skipped] = [e for e in logs if e["event"] == "dra-claim-unreadable"]
        assert (skipped["claim_uid"], skipped["claim"]) == (uids["bomb"], f"{NAMESPACE}/bomb")
        everything = {c["metadata"]["uid"] for c in await dra.list_claims()}
        assert everything >= wanted | {uids["a0"]}
        assert uids["bomb"] not in everything
        with pytest.raises(ClaimUnreadable, match="bomb"):
            await dra.list_claims({uids["bomb"]})
    finally:
        await client.close()
