"""The admission gate: a few new upstream requests per turn of the loop, first come first served."""

from __future__ import annotations

import asyncio

import pytest

from service.core.admission import Admission


async def _turns_of(admission: Admission, callers: int) -> tuple[list[int], list[int]]:
    """Start ``callers`` at once; return the order they got in and the loop turn each got in at."""
    turn = 0
    order: list[int] = []
    turns: list[int] = []
    counting = True

    def tick() -> None:
        nonlocal turn
        turn += 1
        if counting:
            asyncio.get_running_loop().call_soon(tick)

    asyncio.get_running_loop().call_soon(tick)

    async def caller(n: int) -> None:
        await admission.enter()
        order.append(n)
        turns.append(turn)

    await asyncio.gather(*(caller(n) for n in range(callers)))
    counting = False
    return order, turns


async def test_a_burst_is_let_in_a_few_per_turn_in_arrival_order() -> None:
    order, turns = await _turns_of(Admission(per_turn=4), 20)
    assert order == list(range(20))
    per_turn: dict[int, int] = {}
    for turn in turns:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) == 4
    assert len(per_turn) == 5  # 20 callers, 4 a turn


async def test_a_lone_caller_is_not_delayed() -> None:
    admission = Admission(per_turn=4)
    entered = asyncio.ensure_future(admission.enter())
    await asyncio.sleep(0)  # one step of the task: it must be through without waiting for a turn
    assert entered.done()
    assert admission.waiting == 0


async def test_a_cancelled_waiter_leaves_the_line_and_the_next_one_moves_up() -> None:
    admission = Admission(per_turn=1)
    callers = [asyncio.ensure_future(admission.enter()) for _ in range(3)]
    await asyncio.sleep(0)  # one turn: the first is in, the other two wait
    assert [c.done() for c in callers] == [True, False, False]
    assert admission.waiting == 2
    callers[1].cancel()
    await asyncio.wait_for(callers[2], 1)
    assert callers[1].cancelled()
    assert admission.waiting == 0


def test_a_gate_that_admits_nobody_is_refused() -> None:
    with pytest.raises(ValueError):
        Admission(per_turn=0)
