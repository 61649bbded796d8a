"""InFlight: one run of a piece of work for every caller asking for it while it is under way."""

from __future__ import annotations

import asyncio

import pytest

from textbook_chat.core.inflight import InFlight


class Work:
    """Work that counts its runs and finishes when told to."""

    def __init__(self) -> None:
        self.runs = 0
        self.release = asyncio.Event()
        self.fail = False

    async def __call__(self) -> str:
        self.runs += 1
        await self.release.wait()
        if self.fail:
            raise RuntimeError("the index is down")
        return f"result {self.runs}"


async def test_callers_asking_while_it_runs_share_one_run_and_a_later_caller_starts_another() -> None:
    kept: list[tuple[str, str]] = []
    shared, work = InFlight[str, str](on_result=lambda key, value: kept.append((key, value))), Work()
    callers = [asyncio.create_task(shared("question", work)) for _ in range(3)]
    await asyncio.sleep(0)
    work.release.set()
    assert await asyncio.gather(*callers) == ["result 1"] * 3
    assert work.runs == 1 and kept == [("question", "result 1")] and len(shared) == 0
    assert await shared("question", work) == "result 2"  # nothing outlives the run: the caller keeps what it wants


async def test_a_cancelled_caller_leaves_the_run_to_finish_for_the_others() -> None:
    kept: list[str] = []
    shared, work = InFlight[str, str](on_result=lambda key, value: kept.append(value)), Work()
    refused = asyncio.create_task(shared("question", work))
    waiting = asyncio.create_task(shared("question", work))
    await asyncio.sleep(0)
    refused.cancel()
    work.release.set()
    with pytest.raises(asyncio.CancelledError):
        await refused
    assert await waiting == "result 1" and kept == ["result 1"] and work.runs == 1


async def test_when_the_last_caller_gives_up_the_run_is_cancelled_unless_it_is_worth_finishing() -> None:
    kept: list[str] = []
    for cancel_abandoned in (True, False):
        shared = InFlight[str, str](on_result=lambda key, value: kept.append(value), cancel_abandoned=cancel_abandoned)
        work = Work()
        refused = asyncio.create_task(shared("question", work))
        await asyncio.sleep(0)
        refused.cancel()
        with pytest.raises(asyncio.CancelledError):
            await refused
        work.release.set()
        await asyncio.sleep(0.01)
        assert len(shared) == 0
    assert kept == ["result 1"]  # only the run that was not cancelled with its last caller finished


async def test_a_failed_run_fails_every_caller_and_is_not_kept() -> None:
    kept: list[str] = []
    shared, work = InFlight[str, str](on_result=lambda key, value: kept.append(value)), Work()
    work.fail = True
    callers = [asyncio.create_task(shared("question", work)) for _ in range(2)]
    await asyncio.sleep(0)
    work.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and kept == [] and len(shared) == 0
    work.fail = False
    assert await shared("question", work) == "result 2"  # the next caller starts afresh


def test_a_run_of_a_loop_that_ended_is_not_shared_with_another_loop() -> None:
    shared, work = InFlight[str, str](), Work()

    async def abandon() -> None:
        shared.running("question", work)  # the loop ends with the run under way

    asyncio.run(abandon())

    async def ask() -> str:
        work.release = asyncio.Event()
        work.release.set()
        return await shared("question", work)

    assert asyncio.run(ask()) == "result 2"
