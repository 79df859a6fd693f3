import asyncio


async def test_async_runs() -> None:
    await asyncio.sleep(0)


def test_sync_runs() -> None:
    assert 1 + 1 == 2
