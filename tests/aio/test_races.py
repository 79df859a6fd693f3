"""`aio.races.first_of`: the first to end wins, and no loser is left running."""

from __future__ import annotations

import asyncio

import pytest

from gpuslice.aio.races import first_of


async def test_the_first_to_end_wins_and_the_others_are_cancelled_and_gone() -> None:
    go = asyncio.Event()
    never = asyncio.Event()
    loser = asyncio.create_task(never.wait(), name="loser")
    go.set()
    winner, lost = await first_of(go.wait(), loser)
    assert not winner.cancelled()
    assert winner.result() is True
    assert lost is loser
    assert loser.cancelled()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_within_s_ends_the_wait_without_an_error_and_cancels_every_wait() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    futures = await first_of(a.wait(), b.wait(), within_s=0.01)
    assert all(f.cancelled() for f in futures)


async def test_an_exception_is_kept_on_its_future_not_raised_or_lost() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed, other = await first_of(fails(), asyncio.Event().wait())
    assert isinstance(failed.exception(), ValueError)
    assert other.cancelled()


async def test_cancelling_the_caller_cancels_every_wait() -> None:
    started = asyncio.Event()
    inner: list[asyncio.Task[bool]] = []

    async def waits() -> None:
        task = asyncio.create_task(asyncio.Event().wait())
        inner.append(task)
        started.set()
        await first_of(task, asyncio.Event().wait())

    outer = asyncio.create_task(waits())
    await started.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert inner[0].cancelled()
