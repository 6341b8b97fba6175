"""How a log's subscribers wait: woken by the next append, or by the keep-alive's idle period."""

from __future__ import annotations

import asyncio

from service.core.wakeup import IdleWait, Wakeup

EARLY = 0.001  # asyncio may run a timer up to its clock's resolution early


async def test_a_notify_wakes_the_waiters_taken_before_it_only() -> None:
    wakeup = Wakeup()
    before = wakeup.waiter()
    wakeup.notify()
    after = wakeup.waiter()
    assert before.done() and before.result() is True
    assert not after.done()
    wakeup.notify()
    assert after.done()


async def test_a_wait_ends_with_the_notify() -> None:
    wakeup, idle = Wakeup(), IdleWait(60.0)
    waiter = wakeup.waiter()
    asyncio.get_running_loop().call_soon(wakeup.notify)
    assert await idle.wait(waiter) is True
    idle.close()


async def test_a_wait_without_news_ends_after_the_idle_period() -> None:
    loop = asyncio.get_running_loop()
    idle = IdleWait(0.05)
    started = loop.time()
    assert await idle.wait(Wakeup().waiter()) is False
    assert loop.time() - started >= 0.05 - EARLY
    # and the next wait has a whole period of its own
    started = loop.time()
    assert await idle.wait(Wakeup().waiter()) is False
    assert loop.time() - started >= 0.05 - EARLY


async def test_news_gives_the_next_wait_a_whole_idle_period() -> None:
    loop = asyncio.get_running_loop()
    wakeup, idle = Wakeup(), IdleWait(0.1)
    waiter = wakeup.waiter()
    loop.call_later(0.06, wakeup.notify)
    assert await idle.wait(waiter) is True
    idle.news()
    started = loop.time()
    assert await idle.wait(wakeup.waiter()) is False
    # not what was left of the first period (0.04 s): a whole one from this wait
    assert loop.time() - started >= 0.1 - EARLY
    idle.close()
