"""A Kubernetes API server double over real HTTP, for tests and the demo.

The k8s adapter is tested through lightkube's real HTTP client against this server (no
mocked client): it serves the few endpoints gpuslice uses with the API's real shapes,
resource versions and streaming watch semantics (initial ADDED events, replay from a
resourceVersion, `410 Gone` for a compacted version, server-side timeouts).

Served:
* `GET/PATCH /api/v1/nodes/<name>` (merge, strategic-merge treated as merge, JSON patch, and
  server-side apply of labels: each field manager owns the labels it applied; a patch
  leaving an invalid label key or value is refused whole, 422, as the real server does);
* `GET /api/v1/nodes[?fieldSelector=metadata.name=<n>][&watch=true]` (list or watch);
* `GET /api/v1/pods` and `GET /api/v1/namespaces/<ns>/pods` (list or watch), field
  selectors on `spec.nodeName`, `metadata.name`, `metadata.namespace` (`,` joins them);
* `POST/GET /api/v1/namespaces/<ns>/events`, `PATCH .../events/<name>`;
* `resource.k8s.io/v1` (DRA): `resourceslices` and `deviceclasses` (cluster-scoped) and
  `namespaces/<ns>/resourceclaims` (plus the all-namespaces list): list (slices filtered by
  `spec.nodeName`, `spec.driver`, `metadata.name`; every list paged by `limit` and
  `continue`), get, create (`generateName` honoured; 409 for a taken name), replace
  (`PUT`; 409 when the sent `metadata.resourceVersion` is stale; a claim's `status`
  changes only through `PUT .../resourceclaims/<name>/status`) and delete (404 when
  absent). Slices can be watched (same field selectors; a BOOKMARK
  before a watch's `timeoutSeconds` ends it, when `allowWatchBookmarks=true`); other DRA
  watches are not served (400).

Label selectors are not implemented (gpuslice does not use them): requests carrying one are
answered `400`, so a test cannot silently pass on an unfiltered answer.

It runs in its own thread (`ThreadingHTTPServer`), so it works from sync and async tests
alike and never adds tasks to the test's event loop.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from gpuslice.core.jsontypes import Json

HISTORY_LIMIT = 1000
"""Watch events kept for replay; older resourceVersions get `410 Gone`, as after etcd
compaction."""


_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_problem(labels: Mapping[str, object]) -> str | None:
    """Why the real API server refuses these labels (422), or None: a key is an optional
    DNS-subdomain prefix and `/` and a name of at most 63 characters, a value at most 63
    characters; names and values are alphanumeric at both ends with `-`, `_`, `.` inside."""
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        ):
            return f'metadata.labels: Invalid value: "{key}": not a valid label key'
        if not isinstance(value, str):
            return f"metadata.labels: Invalid value: {value!r}: a label value is a string"
        if len(value) > 63:
            return f'metadata.labels: Invalid value: "{value}": must be no more than 63 characters'
        if not _LABEL_VALUE.match(value):
            return (
                f'metadata.labels: Invalid value: "{value}": a valid label must be an empty '
                "string or consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character"
            )
    return None


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str


@dataclass(frozen=True, slots=True)
class _Change:
    rv: int
    type: str
    obj: Json


_FIELDS: dict[str, tuple[str, ...]] = {
    "Node": ("metadata.name",),
    "Pod": ("metadata.name", "metadata.namespace", "spec.nodeName"),
    "ResourceSlice": ("spec.nodeName", "spec.driver", "metadata.name"),
}
"""Field selectors served per kind (the real API server rejects others with 400 too)."""
_RESOURCE_KINDS = {
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "deviceclasses": "DeviceClass",
}
_RESOURCE_FIELDS = {"resourceslices": ("spec.nodeName", "spec.driver", "metadata.name")}
"""Field selectors served on resource.k8s.io lists (the kubelet and drivers use these)."""
_NAMESPACED_RESOURCES = frozenset({"resourceclaims"})


class FakeApiServer:
    """Holds nodes, pods and events; test helpers change them as a controller, the kubelet
    or a user would."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._cond = threading.Condition()
        self._rv = itertools.count(1)
        self._last_rv = 0
        self._nodes: dict[str, Json] = {}
        self._pods: dict[tuple[str, str], Json] = {}
        self._events: dict[tuple[str, str], Json] = {}
        self._label_owners: dict[str, dict[str, set[str]]] = {}
        """Node -> field manager -> the label keys it applied (server-side apply)."""
        self._resources: dict[tuple[str, str, str], Json] = {}
        """resource.k8s.io/v1 objects by (plural, namespace or "", name)."""
        self._history: list[_Change] = []
        self._closing = False
        self._watch_generation = 0
        self._fail_next: list[int] = []
        self._sockets: set[socket.socket] = set()
        self.requests: list[RecordedRequest] = []
        self.watches_started = 0
        self.bookmarks = True
        """Send a BOOKMARK before a watch's timeout ends it, when the client asks for them
        (off: a server that sends none, which the API allows)."""
        self.evictions: list[tuple[str, str]] = []
        """(namespace, pod) of each eviction the API accepted, in order."""
        self.block_evictions = False
        """True answers evictions 429, as a PodDisruptionBudget that allows none does."""
        self.taint_effects: tuple[str, ...] = ("NoExecute", "NoSchedule", "None")
        """Device taint effects a slice may use; `("NoExecute", "NoSchedule")` is a server
        before 1.35, which refuses `None` (422, the real server's message)."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        server = _QuietServer((self._host, 0), _handler_for(self))
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, namespace: str = "default") -> Json:
        """A kubeconfig document pointing at this server (plain HTTP, a dummy token)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace)), encoding="utf-8")
        return path

    # -- test controls -------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Json:
        with self._cond:
            node: Json = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),  # as the real server: an RFC 4122 UUID
                    "labels": dict(labels or {}),
                    "annotations": {},
                    "creationTimestamp": _now(),
                },
                "spec": {},
                "status": {},
            }
            self._nodes[name] = node
            self._record("ADDED", node)
            return copy.deepcopy(node)

    def set_node_label(self, node: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one label, emitting a MODIFIED watch event."""
        with self._cond:
            labels = self._nodes[node]["metadata"].setdefault("labels", {})
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
            self._record("MODIFIED", self._nodes[node])

    def set_node_annotation(self, node: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one annotation, emitting a MODIFIED watch event."""
        with self._cond:
            annotations = self._nodes[node]["metadata"].setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
            self._record("MODIFIED", self._nodes[node])

    def delete_node(self, name: str) -> None:
        with self._cond:
            node = self._nodes.pop(name)
            self._record("DELETED", node)

    def node(self, name: str) -> Json:
        with self._cond:
            return copy.deepcopy(self._nodes[name])

    def add_pod(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        node: str,
        containers: Mapping[str, str] | None = None,
    ) -> Json:
        """A pod already bound to `node` and running. `containers` maps each container's
        name to its status `containerID`: `containerd://<id>`, `cri-o://<id>`, ...; a bare
        id reads as containerd's, and "" as a container not started yet (no containerID).
        `uid` None draws a random UUID."""
        with self._cond:
            if (namespace, name) in self._pods:
                raise ValueError(f"pod {namespace}/{name} already exists")
            pod: Json = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid or str(uuid.uuid4()),
                    "labels": {},
                    "creationTimestamp": _now(),
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": c, "image": "cuda:test"} for c in containers or {}],
                },
                "status": {"phase": "Running", "containerStatuses": []},
            }
            _set_container_statuses(pod, containers or {})
            self._pods[(namespace, name)] = pod
            self._record("ADDED", pod)
            return copy.deepcopy(pod)

    def set_pod_containers(self, namespace: str, name: str, containers: Mapping[str, str]) -> None:
        """Replace the pod's container statuses (a restart gives a container a new ID),
        emitting a MODIFIED watch event. Values as for `add_pod`; the names must be the
        pod's containers: a pod's container list never changes on the real server."""
        with self._cond:
            pod = self._pods[(namespace, name)]
            names = {c["name"] for c in pod["spec"]["containers"]}
            if not set(containers) <= names:
                raise ValueError(f"pod {namespace}/{name} has containers {sorted(names)} only")
            _set_container_statuses(pod, containers)
            self._record("MODIFIED", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            pod = self._pods.pop((namespace, name))
            self._record("DELETED", pod)

    def pod(self, namespace: str, name: str) -> Json:
        with self._cond:
            return copy.deepcopy(self._pods[(namespace, name)])

    def events(self, namespace: str | None = None) -> list[Json]:
        with self._cond:
            return [
                copy.deepcopy(e)
                for (ns, _), e in self._events.items()
                if namespace is None or ns == namespace
            ]

    # -- resource.k8s.io/v1 (DRA) ----------------------------------------------------------

    def add_device_class(self, obj: Json) -> Json:
        """A DeviceClass as an admin or a Helm chart applies it (`metadata.name` required)."""
        return self._put_resource("deviceclasses", "", copy.deepcopy(obj))

    def device_classes(self) -> list[Json]:
        return self._resources_of("deviceclasses")

    def add_claim(self, obj: Json) -> Json:
        """A ResourceClaim as a user creates it (`metadata.namespace` and `name` required)."""
        claim = copy.deepcopy(obj)
        return self._put_resource("resourceclaims", claim["metadata"]["namespace"], claim)

    def claim(self, namespace: str, name: str) -> Json:
        with self._cond:
            return copy.deepcopy(self._resources[("resourceclaims", namespace, name)])

    def claims(self, namespace: str | None = None) -> list[Json]:
        return [
            c
            for c in self._resources_of("resourceclaims")
            if namespace is None or c["metadata"]["namespace"] == namespace
        ]

    def set_claim_status(self, namespace: str, name: str, status: Json) -> Json:
        """What the scheduler writes: the allocation and `reservedFor`."""
        with self._cond:
            claim = copy.deepcopy(self._resources[("resourceclaims", namespace, name)])
            claim["status"] = copy.deepcopy(status)
            return self._put_resource("resourceclaims", namespace, claim)

    def delete_claim(self, namespace: str, name: str) -> None:
        with self._cond:
            self._resources.pop(("resourceclaims", namespace, name), None)
            self._bump_resources()

    def resource_slices(self, node: str | None = None, driver: str | None = None) -> list[Json]:
        """Slices in name order (the API's list order), optionally of one node and driver."""
        return [
            o
            for o in self._resources_of("resourceslices")
            if (node is None or _field(o, "spec.nodeName") == node)
            and (driver is None or _field(o, "spec.driver") == driver)
        ]

    def delete_slice(self, name: str) -> None:
        """Delete one slice, as another writer (or an admin) would; KeyError if absent."""
        with self._cond:
            self._deleted_slice(self._resources.pop(("resourceslices", "", name)))

    def delete_all_slices(self, node: str, driver: str | None = None) -> int:
        """What the kubelet does at its start (every driver's slices of `node`) and 30 s
        after a driver's plugin went away (`driver` given). Returns how many went."""
        with self._cond:
            doomed = [
                key
                for key, o in self._resources.items()
                if key[0] == "resourceslices"
                and _field(o, "spec.nodeName") == node
                and (driver is None or _field(o, "spec.driver") == driver)
            ]
            for key in doomed:
                self._deleted_slice(self._resources.pop(key))
            self._bump_resources()
            return len(doomed)

    def _deleted_slice(self, obj: Json) -> None:
        """A deletion is a watch event with a version of its own (call with the lock held)."""
        self._record("DELETED", copy.deepcopy(obj))

    def _resources_of(self, plural: str) -> list[Json]:
        with self._cond:
            return [
                copy.deepcopy(o) for key, o in sorted(self._resources.items()) if key[0] == plural
            ]

    def _put_resource(self, plural: str, namespace: str, obj: Json) -> Json:
        """Store `obj` (owned by the store from here on) with a new resourceVersion; a new
        object gets a UID, a creation time and `metadata.generation` 1, a replaced one
        keeps its UID and its generation goes up when its spec changed (as on the real
        server; a status write leaves it)."""
        with self._cond:
            meta = obj.setdefault("metadata", {})
            key = (plural, namespace, meta["name"])
            old = self._resources.get(key)
            if old is not None:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                generation = int(old["metadata"].get("generation", 1))
                changed = obj.get("spec") != old.get("spec")
                meta["generation"] = generation + 1 if changed else generation
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta["generation"] = 1
            if namespace:
                meta["namespace"] = namespace
            obj.setdefault("apiVersion", "resource.k8s.io/v1")
            obj.setdefault("kind", _RESOURCE_KINDS[plural])
            self._resources[key] = obj
            if plural == "resourceslices":
                self._record("MODIFIED" if old is not None else "ADDED", obj)
            else:
                self._bump(obj)
            return copy.deepcopy(obj)

    def _bump_resources(self) -> None:
        """A deletion moves the list's resourceVersion on, as in the real API."""
        self._last_rv = next(self._rv)
        self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Block until `predicate()` holds (re-checked on every change and request) or the
        timeout."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout_s)

    def break_watches(self) -> None:
        """Cut every open watch stream mid-stream, as a network failure or an API server
        restart would: clients see a protocol error, not a clean end."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    def fail_next_requests(self, count: int, status: int = 503) -> None:
        """Answer the next `count` requests with `status` (an overloaded API server)."""
        with self._cond:
            self._fail_next.extend([status] * count)

    def compact(self) -> None:
        """Forget watch history, so a watch from an old resourceVersion gets 410 Gone."""
        with self._cond:
            self._history.clear()

    # -- state (call with the lock held) --------------------------------------------------

    def _record(self, kind: str, obj: Json) -> None:
        rv = next(self._rv)
        self._last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        self._history.append(_Change(rv, kind, copy.deepcopy(obj)))
        del self._history[:-HISTORY_LIMIT]
        self._cond.notify_all()

    def _bump(self, obj: Json) -> None:
        rv = next(self._rv)
        self._last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        self._cond.notify_all()


def _set_container_statuses(pod: Json, containers: Mapping[str, str]) -> None:
    statuses: list[Json] = []
    for container, container_id in containers.items():
        status: Json = {
            "name": container,
            "image": "cuda:test",
            "imageID": "",
            "ready": bool(container_id),
            "restartCount": 0,
            "started": bool(container_id),
            "state": {"running": {"startedAt": _now()}}
            if container_id
            else {"waiting": {"reason": "ContainerCreating"}},
        }
        if container_id:
            scheme = "" if "://" in container_id else "containerd://"
            status["containerID"] = scheme + container_id
        statuses.append(status)
    pod["status"]["containerStatuses"] = statuses


def _field(obj: Json, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _continue_token(key: tuple[str, str]) -> str:
    """Where the next page starts: after this (namespace, name). The real server's token
    also pins the first page's resourceVersion; here a page reads the state of its time."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def _continue_key(token: str) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"continue key {token[:40]!r} is not valid") from exc
    return str(namespace), str(name)


def _random_suffix() -> str:
    """Five characters, as the API server appends to a `generateName`."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(5))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Json, ops: list[Json]) -> Json:
    """RFC 6902 add/replace/remove on object members (what label patches use)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [
            unquote(p).replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            parent[last] = op["value"]
        elif op["op"] == "remove":
            if last not in parent:
                raise KeyError(op["path"])
            del parent[last]
        else:
            raise ValueError(f"unsupported JSON patch op {op['op']!r}")
    return doc


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-stream (cancelled watches) are normal here, not errors."""


_EMPTY_BODIES: dict[str, Json] = {
    "Pod": {"spec": {"containers": None}, "status": {}},
    "Node": {"spec": {}, "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                                    "nodeInfo": {"machineID": "", "systemUUID": "",
                                                 "bootID": "", "kernelVersion": "",
                                                 "osImage": "", "containerRuntimeVersion": "",
                                                 "kubeletVersion": "", "kubeProxyVersion": "",
                                                 "operatingSystem": "", "architecture": ""}}},
}  # fmt: skip
"""What the real server's bookmark carries besides its version: the kind's empty Go struct
encoded as JSON, so a Pod's `spec.containers` is `null` (a field without omitempty), which a
typed client model refuses. Seen from kube-apiserver 1.36 (issue 33)."""


def _bookmark(kind: str, position: int) -> Json:
    api_version = "resource.k8s.io/v1" if kind == "ResourceSlice" else "v1"
    return {"kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": str(position), "creationTimestamp": None},
            **copy.deepcopy(_EMPTY_BODIES.get(kind, {}))}  # fmt: skip


def _watch_wakeup(
    api: FakeApiServer, generation: int, position: int, deadline: float | None
) -> Callable[[], bool]:
    def ready() -> bool:
        return (
            api._closing
            or api._watch_generation != generation
            or api._last_rv > position
            or (deadline is not None and time.monotonic() >= deadline)
        )

    return ready


def _handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_state = api

    return Handler


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeApiServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go's API server: no ~40 ms delayed-ACK stall per reply

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: test output stays readable; `FakeApiServer.requests` records requests."""

    def setup(self) -> None:
        super().setup()
        with self.server_state._cond:
            self.server_state._sockets.add(self.connection)

    def finish(self) -> None:
        with suppress(OSError):
            super().finish()
        with self.server_state._cond:
            self.server_state._sockets.discard(self.connection)

    # -- dispatch ------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        api = self.server_state
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._read_body()
        with api._cond:
            api.requests.append(
                RecordedRequest(method, url.path, query, self.headers.get("Content-Type", ""))
            )
            failure = api._fail_next.pop(0) if api._fail_next else None
            api._cond.notify_all()  # `wait_for` predicates may count requests
        if failure is not None:
            self._send(failure, _status(failure, "ServiceUnavailable", "injected failure"))
            return
        parts = [p for p in url.path.split("/") if p]
        try:
            self._route(method, parts, query, body)
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
            self._send(400, _status(400, "BadRequest", f"bad request: {exc}"))

    def _route(self, method: str, parts: list[str], query: dict[str, str], body: bytes) -> None:
        if parts[:3] == ["apis", "resource.k8s.io", "v1"]:
            self._resource(method, parts[3:], query, body)
            return
        if parts[:3] == ["api", "v1", "nodes"]:
            if len(parts) == 3 and method == "GET":
                self._collection("Node", None, query)
                return
            if len(parts) == 4:
                self._one_node(method, parts[3], body)
                return
        if parts == ["api", "v1", "pods"] and method == "GET":
            self._collection("Pod", None, query)
            return
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "events":
            self._events(method, parts[3], parts[5] if len(parts) > 5 else None, body)
            return
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"] and method == "GET":
            self._collection("Pod", parts[3], query)
            return
        if (
            parts[:3] == ["api", "v1", "namespaces"]
            and len(parts) == 7
            and parts[4] == "pods"
            and parts[6] == "eviction"
            and method == "POST"
        ):
            self._evict(parts[3], parts[5], body)
            return
        self._send(404, _status(404, "NotFound", f"the server could not find {self.path}"))

    # -- resource.k8s.io/v1 ---------------------------------------------------------------

    def _resource(self, method: str, parts: list[str], query: dict[str, str], body: bytes) -> None:
        """DRA objects: list (with field selectors on slices), get, create (generateName),
        replace (409 on a stale resourceVersion; claims' `/status` too) and delete."""
        api = self.server_state
        namespace = ""
        if parts[:1] == ["namespaces"] and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        plural = parts[0] if parts else ""
        name = parts[1] if len(parts) > 1 else None
        subresource = parts[2] if len(parts) > 2 else None
        namespaced = plural in _NAMESPACED_RESOURCES
        known = plural in _RESOURCE_KINDS and len(parts) <= 3
        in_scope = bool(namespace) == namespaced or (not namespace and name is None)
        if not known or not in_scope or subresource not in (None, "status"):
            self._send(404, _status(404, "NotFound", f"the server could not find {self.path}"))
            return
        if subresource == "status" and plural != "resourceclaims":
            self._send(404, _status(404, "NotFound", f"the server could not find {self.path}"))
            return
        if name is None and method == "GET":
            watch = query.get("watch") in ("true", "1")
            if watch and plural == "resourceslices" and not query.get("labelSelector"):
                self._watch("ResourceSlice", None, query)
                return
            if query.get("labelSelector") or watch:
                self._send(400, _status(400, "BadRequest", "labelSelector/watch not served"))
                return
            wanted = self._resource_selector(plural, query)
            limit = int(query.get("limit") or 0)
            after = _continue_key(query.get("continue", ""))
            with api._cond:
                keys = [
                    (ns, n)
                    for (p, ns, n), o in sorted(api._resources.items())
                    if p == plural
                    and (not namespace or ns == namespace)
                    and (after is None or (ns, n) > after)
                    and wanted(o)
                ]
                page = keys[:limit] if limit > 0 else keys
                metadata: Json = {"resourceVersion": str(api._last_rv)}
                if len(page) < len(keys):
                    metadata["continue"] = _continue_token(page[-1])
                    metadata["remainingItemCount"] = len(keys) - len(page)
                listing = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": f"{_RESOURCE_KINDS[plural]}List",
                    "metadata": metadata,
                    "items": [copy.deepcopy(api._resources[(plural, *k)]) for k in page],
                }
            self._send(200, listing)
            return
        if name is None and method == "POST" and (namespace or not namespaced):
            self._create_resource(plural, namespace, json.loads(body))
            return
        if name is None:
            self._send(405, _status(405, "MethodNotAllowed", method))
            return
        with api._cond:
            key = (plural, namespace, name)
            current = api._resources.get(key)
            if current is None:
                message = f'{plural}.resource.k8s.io "{name}" not found'
                self._send(404, _status(404, "NotFound", message))
            elif method == "GET":
                self._send(200, current)
            elif method == "DELETE" and subresource is None:
                del api._resources[key]
                if plural == "resourceslices":
                    api._deleted_slice(current)
                else:
                    api._bump_resources()
                self._send(200, current)
            elif method == "PUT":
                self._replace_resource(plural, namespace, name, subresource, current, body)
            else:
                self._send(405, _status(405, "MethodNotAllowed", method))

    def _create_resource(self, plural: str, namespace: str, obj: Json) -> None:
        api = self.server_state
        meta = obj.setdefault("metadata", {})
        with api._cond:
            if not meta.get("name"):
                if not meta.get("generateName"):
                    self._send(422, _status(422, "Invalid", "metadata.name: Required value"))
                    return
                meta["name"] = meta["generateName"] + _random_suffix()
            if (plural, namespace, meta["name"]) in api._resources:
                message = f'{plural}.resource.k8s.io "{meta["name"]}" already exists'
                self._send(409, _status(409, "AlreadyExists", message))
                return
            for server_set in ("resourceVersion", "uid", "creationTimestamp", "generation"):
                meta.pop(server_set, None)
            if plural == "resourceclaims":
                obj.pop("status", None)  # status is written through /status only
            if not self._valid_slice(plural, obj):
                return
            self._send(201, api._put_resource(plural, namespace, obj))

    def _replace_resource(
        self,
        plural: str,
        namespace: str,
        name: str,
        subresource: str | None,
        current: Json,
        body: bytes,
    ) -> None:
        """A PUT (call with the lock held): the sent resourceVersion, when there is one,
        must be the stored one, as optimistic concurrency in the real API."""
        api = self.server_state
        obj = json.loads(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            message = f"the name of the object ({meta['name']}) does not match the URL ({name})"
            self._send(400, _status(400, "BadRequest", message))
            return
        sent_rv = str(meta.get("resourceVersion") or "")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {plural}.resource.k8s.io "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again"
            )
            self._send(409, _status(409, "Conflict", message))
            return
        if subresource == "status":
            obj = dict(copy.deepcopy(current), status=obj.get("status"))
        elif plural == "resourceclaims":
            obj["status"] = copy.deepcopy(current.get("status"))  # status only via /status
            if obj["status"] is None:
                del obj["status"]
        meta["name"] = name
        if not self._valid_slice(plural, obj):
            return
        self._send(200, api._put_resource(plural, namespace, obj))

    def _valid_slice(self, plural: str, obj: Json) -> bool:
        """Refuse a slice whose taint effect the server does not know, as the real one
        does (`spec.devices[i].taints[j].effect: Unsupported value: ...`, 422)."""
        if plural != "resourceslices":
            return True
        effects = self.server_state.taint_effects
        for i, device in enumerate((obj.get("spec") or {}).get("devices") or []):
            for j, taint in enumerate(device.get("taints") or []):
                effect = taint.get("effect")
                if effect not in effects:
                    name = (obj.get("metadata") or {}).get("name", "")
                    known = ", ".join(f'"{e}"' for e in effects)
                    message = (
                        f'ResourceSlice.resource.k8s.io "{name}" is invalid: '
                        f"spec.devices[{i}].taints[{j}].effect: Unsupported value: "
                        f'"{effect}": supported values: {known}'
                    )
                    self._send(422, _status(422, "Invalid", message))
                    return False
        return True

    def _resource_selector(self, plural: str, query: dict[str, str]) -> Callable[[Json], bool]:
        selector = query.get("fieldSelector", "")
        wanted: list[tuple[str, str]] = []
        for term in filter(None, selector.split(",")):
            key, eq, value = term.replace("==", "=").partition("=")
            if not eq or "!" in key or key not in _RESOURCE_FIELDS.get(plural, ()):
                raise ValueError(f"field selector {selector!r} not supported")
            wanted.append((key, value))
        return lambda obj: all(_field(obj, key) == value for key, value in wanted)

    # -- pods ----------------------------------------------------------------------------

    def _evict(self, namespace: str, name: str, body: bytes) -> None:
        """The Eviction subresource: deletes the pod at once (no graceful termination here),
        or 429 while `block_evictions` stands in for a PodDisruptionBudget."""
        api = self.server_state
        eviction = json.loads(body or b"{}")
        if eviction.get("kind") != "Eviction":
            self._send(400, _status(400, "BadRequest", "expected an Eviction"))
            return
        with api._cond:
            if (namespace, name) not in api._pods:
                self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                return
            if api.block_evictions:
                message = "Cannot evict pod as it would violate the pod's disruption budget."
                self._send(429, _status(429, "TooManyRequests", message))
                return
            pod = api._pods.pop((namespace, name))
            api.evictions.append((namespace, name))
            api._record("DELETED", pod)
        self._send(201, eviction)

    # -- nodes ---------------------------------------------------------------------------

    def _one_node(self, method: str, name: str, body: bytes) -> None:
        api = self.server_state
        with api._cond:
            node = api._nodes.get(name)
            if node is None:
                self._send(404, _status(404, "NotFound", f'nodes "{name}" not found'))
                return
            if method == "GET":
                self._send(200, node)
                return
            if method != "PATCH":
                self._send(405, _status(405, "MethodNotAllowed", method))
                return
            if self.headers.get("Content-Type", "").startswith("application/apply-patch"):
                applied = json.loads(body or b"{}")
                problem = label_problem((applied.get("metadata") or {}).get("labels") or {})
                if problem is None:
                    patched = self._server_side_apply(node, body)
            else:
                patched = self._apply_patch(node, body)
                problem = label_problem(patched["metadata"].get("labels") or {})
            if problem is not None:  # as the real server: the whole patch is refused
                self._send(422, _status(422, "Invalid", f'Node "{name}" is invalid: {problem}'))
                return
            patched["metadata"]["name"] = name
            patched["metadata"]["uid"] = node["metadata"]["uid"]
            api._nodes[name] = patched
            api._record("MODIFIED", patched)
            self._send(200, patched)

    def _server_side_apply(self, node: Json, body: bytes) -> Json:
        """Server-side apply of a Node's labels, as far as the agent uses it: the field
        manager owns the labels it applied; a label it applied before and no longer applies
        is removed, others' labels are left alone. (Only labels: the agent applies nothing
        else. `force=true` is assumed, as the agent sends it.)"""
        manager = parse_qs(urlsplit(self.path).query).get("fieldManager", [""])[0]
        if not manager:
            raise ValueError("server-side apply needs a fieldManager")
        applied = json.loads(body or b"{}")
        wanted: dict[str, str] = (applied.get("metadata") or {}).get("labels") or {}
        owned = self.server_state._label_owners.setdefault(node["metadata"]["name"], {})
        before = owned.get(manager, set())
        out = copy.deepcopy(node)
        labels = out["metadata"].setdefault("labels", {})
        for key in before - set(wanted):
            if not any(key in keys for m, keys in owned.items() if m != manager):
                labels.pop(key, None)
        labels.update(wanted)
        for other, keys in owned.items():
            if other != manager:
                keys -= set(wanted)  # force: the applier takes the fields over
        owned[manager] = set(wanted)
        return out

    def _apply_patch(self, obj: Json, body: bytes) -> Json:
        ctype = self.headers.get("Content-Type", "")
        patch = json.loads(body or b"null")
        if ctype.startswith("application/json-patch+json"):
            return json_patch(obj, patch)
        if ctype.startswith(
            ("application/merge-patch+json", "application/strategic-merge-patch+json")
        ):
            merged: Json = merge_patch(obj, patch)
            return merged
        raise ValueError(f"unsupported patch content type {ctype!r}")

    def _selected(
        self, kind: str, namespace: str | None, query: dict[str, str]
    ) -> Callable[[Json], bool]:
        """Which objects a list or watch of `kind` (in `namespace`, None for all) covers."""
        wanted: list[tuple[str, str]] = [("kind", kind)]
        if namespace is not None:
            wanted.append(("metadata.namespace", namespace))
        selector = query.get("fieldSelector", "")
        for term in filter(None, selector.split(",")):
            key, eq, value = term.replace("==", "=").partition("=")
            if not eq or "!" in key or key not in _FIELDS[kind]:
                raise ValueError(f"field selector {selector!r} not supported")
            wanted.append((key, value))
        return lambda obj: all(_field(obj, key) == value for key, value in wanted)

    def _collection(self, kind: str, namespace: str | None, query: dict[str, str]) -> None:
        if query.get("labelSelector"):
            self._send(400, _status(400, "BadRequest", "labelSelector not supported"))
        elif query.get("watch") in ("true", "1"):
            self._watch(kind, namespace, query)
        else:
            self._list(kind, namespace, query)

    def _store(self, kind: str) -> list[Json]:
        """Every object of `kind` (call with the lock held)."""
        api = self.server_state
        if kind == "ResourceSlice":
            return [o for k, o in api._resources.items() if k[0] == "resourceslices"]
        return list(api._nodes.values() if kind == "Node" else api._pods.values())

    def _list(self, kind: str, namespace: str | None, query: dict[str, str]) -> None:
        api = self.server_state
        wanted = self._selected(kind, namespace, query)
        with api._cond:
            items = [o for o in self._store(kind) if wanted(o)]
            self._send(
                200,
                {
                    "apiVersion": "v1",
                    "kind": f"{kind}List",
                    "metadata": {"resourceVersion": str(api._last_rv)},
                    "items": items,
                },
            )

    def _watch(self, kind: str, namespace: str | None, query: dict[str, str]) -> None:
        api = self.server_state
        wanted = self._selected(kind, namespace, query)
        since = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = None if timeout is None else time.monotonic() + timeout
        with api._cond:
            api.watches_started += 1
            generation = api._watch_generation
            pending: list[tuple[str, Json]]
            if since in ("", "0"):
                pending = [("ADDED", copy.deepcopy(o)) for o in self._store(kind) if wanted(o)]
                position = api._last_rv
            else:
                start = int(since)
                oldest = api._history[0].rv if api._history else api._last_rv + 1
                if start < oldest - 1 and start < api._last_rv:
                    pending = [
                        ("ERROR", _status(410, "Expired", f"too old resource version: {start}"))
                    ]
                    position = api._last_rv
                else:
                    pending = []
                    position = start
            api._cond.notify_all()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for kind, obj in pending:
            self._chunk({"type": kind, "object": obj})
        if pending and pending[0][0] == "ERROR":
            self._end_chunks()
            return
        while True:
            with api._cond:
                api._cond.wait_for(
                    _watch_wakeup(api, generation, position, deadline),
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                )
                if api._closing or api._watch_generation != generation:
                    self.close_connection = True
                    with suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                changes = [c for c in api._history if c.rv > position and wanted(c.obj)]
                position = api._last_rv
            for change in changes:
                self._chunk({"type": change.type, "object": change.obj})
            if deadline is not None and time.monotonic() >= deadline:
                if query.get("allowWatchBookmarks") == "true" and api.bookmarks:
                    # as the real server does before it ends a watch: the version reached,
                    # so the client resumes from there, not from its stale start
                    self._chunk({"type": "BOOKMARK", "object": _bookmark(kind, position)})
                self._end_chunks()
                return

    # -- events --------------------------------------------------------------------------

    def _events(self, method: str, namespace: str, name: str | None, body: bytes) -> None:
        api = self.server_state
        with api._cond:
            if method == "GET" and name is None:
                items = [e for (ns, _), e in api._events.items() if ns == namespace]
                self._send(200, {"apiVersion": "v1", "kind": "EventList", "items": items})
                return
            if method == "POST" and name is None:
                event: Json = json.loads(body)
                meta = event.setdefault("metadata", {})
                if not meta.get("name"):
                    meta["name"] = meta.get("generateName", "event.") + secrets.token_hex(5)
                if (namespace, meta["name"]) in api._events:
                    self._send(409, _status(409, "AlreadyExists", meta["name"]))
                    return
                involved = (event.get("involvedObject") or {}).get("namespace") or ""
                # kube-apiserver 1.36.2 (legacy event validation), checked against the real
                # server: an Event about a cluster-scoped object lives in `default` (or no
                # namespace), one about a namespaced object in that object's namespace
                if (involved and involved != namespace) or (
                    not involved and namespace not in ("", "default")
                ):
                    self._send(
                        422,
                        _status(
                            422,
                            "Invalid",
                            f'involvedObject.namespace: Invalid value: "{involved}": '
                            "does not match event.namespace",
                        ),
                    )
                    return
                meta["namespace"] = namespace
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = _now()
                api._events[(namespace, meta["name"])] = event
                api._bump(event)
                self._send(201, event)
                return
            if method == "PATCH" and name is not None:
                current = api._events.get((namespace, name))
                if current is None:
                    self._send(404, _status(404, "NotFound", f'events "{name}" not found'))
                    return
                patched = self._apply_patch(current, body)
                api._events[(namespace, name)] = patched
                api._bump(patched)
                self._send(200, patched)
                return
        self._send(405, _status(405, "MethodNotAllowed", method))

    # -- wire ----------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, code: int, payload: Json) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code, HTTPStatus(code).phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, payload: Json) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@contextmanager
def running_apiserver() -> Iterator[FakeApiServer]:
    """`with running_apiserver() as api:` — started on 127.0.0.1, port 0; stopped after."""
    api = FakeApiServer().start()
    try:
        yield api
    finally:
        api.stop()
