"""The DRAPlugin service (v1 and v1beta1 on one socket), delegating to a `ClaimPreparer`.

The kubelet treats a non-OK status as "the whole batch failed" and a missing claim as a
contract violation ("skipped N ResourceClaims"), so this layer guarantees the contract
whatever the preparer does: every claim of the request gets an entry; a malformed claim
(empty, duplicated or over-long fields) gets its own error and is not passed on; a claim the
preparer left out, or a preparer that raises, becomes an `error` text (bounded, control
characters escaped) for the claims concerned, and the call itself always returns OK.

A batch whose `prepare` raises is retried one claim at a time (prepare is idempotent by
contract), so one bad claim does not fail the unrelated claims sent with it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import grpc
from structlog.stdlib import BoundLogger

from gpuslice.core.dra.kubelet_api import ClaimRef, PrepareResult
from gpuslice.core.text import shown, shown_all
from gpuslice.dra.convert import (
    claims_from_proto,
    prepare_response_v1,
    prepare_response_v1beta1,
    unprepare_response_v1,
    unprepare_response_v1beta1,
)
from gpuslice.ports import ClaimPreparer
from gpuslice.protos.dra.v1 import api_pb2 as v1
from gpuslice.protos.dra.v1beta1 import api_pb2 as v1beta1

MAX_UID_CHARS = 128
"""Kubernetes UIDs are 36-character UUIDs; anything much longer is not a claim UID."""
MAX_NAMESPACE_CHARS = 63
"""A namespace is a DNS label."""
MAX_NAME_CHARS = 253
"""A ResourceClaim name is a DNS subdomain."""
MAX_ERROR_CHARS = 1024
"""Characters of one claim's error sent to the kubelet (it ends up in pod events)."""

T = TypeVar("T")


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Error text safe for the kubelet and the log: control characters escaped, length capped."""
    out = "".join(c if c.isprintable() else shown(c) for c in text[:limit])
    if len(text) > limit:
        out += f"...(+{len(text) - limit}_chars)"
    return out or "unknown error"


def malformed(claim: ClaimRef, counts: Mapping[str, int]) -> str:
    """Why the kubelet could not have sent this claim, or "" if it is well formed."""
    if not claim.uid:
        return "claim has an empty uid"
    if len(claim.uid) > MAX_UID_CHARS:
        return f"claim uid {shown(claim.uid)} is longer than {MAX_UID_CHARS} characters"
    if counts[claim.uid] > 1:
        return f"claim uid {shown(claim.uid)} appears {counts[claim.uid]} times in one request"
    if not claim.namespace or len(claim.namespace) > MAX_NAMESPACE_CHARS:
        return (
            f"claim {shown(claim.uid)}: namespace {shown(claim.namespace)} is empty or longer "
            f"than {MAX_NAMESPACE_CHARS} characters"
        )
    if not claim.name or len(claim.name) > MAX_NAME_CHARS:
        return (
            f"claim {shown(claim.uid)}: name {shown(claim.name)} is empty or longer than "
            f"{MAX_NAME_CHARS} characters"
        )
    return ""


class DraServicer:
    """Answers NodePrepareResources / NodeUnprepareResources for both API versions."""

    def __init__(self, preparer: ClaimPreparer, *, logger: BoundLogger) -> None:
        self._preparer = preparer
        self._log = logger

    # -- version-independent core of each call --------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, PrepareResult]:
        started = time.perf_counter()
        results = await self._answer(
            claims, self._preparer.prepare, _prepare_failure, _prepare_cleaned, "prepare"
        )
        failed = {uid: r.error for uid, r in results.items() if r.error}
        self._logged("dra-prepare", version, claims, failed, started)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, str]:
        started = time.perf_counter()
        results = await self._answer(
            claims, self._preparer.unprepare, _unprepare_failure, _unprepare_cleaned, "unprepare"
        )
        failed = {uid: e for uid, e in results.items() if e}
        self._logged("dra-unprepare", version, claims, failed, started)
        return results

    async def _answer(
        self,
        claims: Sequence[ClaimRef],
        call: Callable[[Sequence[ClaimRef]], Awaitable[Mapping[str, T]]],
        failure: Callable[[str], T],
        cleaned: Callable[[T], T],
        what: str,
    ) -> dict[str, T]:
        counts = Counter(c.uid for c in claims)
        out: dict[str, T] = {}
        valid: list[ClaimRef] = []
        for claim in claims:
            problem = malformed(claim, counts)
            if problem:
                out[claim.uid] = failure(problem)
            else:
                valid.append(claim)
        if not valid:
            return out
        try:
            answers = await call(valid)
            for claim in valid:
                if claim.uid in answers:
                    out[claim.uid] = cleaned(answers[claim.uid])
                else:
                    out[claim.uid] = failure(f"gpuslice did not {what} claim {shown(claim.uid)}")
        except Exception as exc:  # a preparer bug or a bad claim: never the whole call
            if len(valid) == 1:
                self._log.exception(f"dra-{what}-raised", claim=shown(valid[0].uid))
                reason = str(exc) or type(exc).__name__
                out[valid[0].uid] = failure(bounded(f"{what} failed: {reason}"))
                return out
            for claim in valid:  # one at a time: only the bad claim fails
                out.update(await self._answer([claim], call, failure, cleaned, what))
        return out

    def _logged(
        self,
        event: str,
        version: str,
        claims: Sequence[ClaimRef],
        failed: Mapping[str, str],
        started: float,
    ) -> None:
        fields: dict[str, object] = {
            "version": version,
            "claims": shown_all(c.uid for c in claims),
            "failed": len(failed),
            "ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if failed:
            uid, error = next(iter(failed.items()))
            self._log.warning(event, **fields, first_claim=shown(uid), first_error=error)
        else:
            self._log.info(event, **fields)

    # -- wire methods ---------------------------------------------------------------------

    async def prepare_v1(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        return prepare_response_v1(await self.prepare(claims_from_proto(request.claims), "v1"))

    async def unprepare_v1(
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        return unprepare_response_v1(await self.unprepare(claims_from_proto(request.claims), "v1"))

    async def prepare_v1beta1(
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        results = await self.prepare(claims_from_proto(request.claims), "v1beta1")
        return prepare_response_v1beta1(results)

    async def unprepare_v1beta1(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        results = await self.unprepare(claims_from_proto(request.claims), "v1beta1")
        return unprepare_response_v1beta1(results)


def _prepare_failure(error: str) -> PrepareResult:
    return PrepareResult(error=error)


def _prepare_cleaned(result: PrepareResult) -> PrepareResult:
    """The preparer's own error text is bounded like ours (it may echo client input)."""
    if not isinstance(result, PrepareResult):
        raise TypeError(f"the preparer answered {type(result).__name__}, not a PrepareResult")
    return PrepareResult(error=bounded(result.error)) if result.error else result


def _unprepare_failure(error: str) -> str:
    return error


def _unprepare_cleaned(error: str) -> str:
    if not isinstance(error, str):
        raise TypeError(f"the preparer answered {type(error).__name__}, not an error text")
    return bounded(error) if error else ""
