"""Answers as Markdown in real headless Chromium: elements, not raw text; the model's HTML never
runs; and a streaming answer is parsed at most once per animation frame, not once per token.

The emulator is told what to answer with ``[emu:say=TEXT]`` (percent-encoded).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.browser.conftest import Served
from tests.browser.test_client import ask, open_page

MARKDOWN = """# Results

Here is **bold** text and `inline code`.

- first item
- second item
- third item

```python
print("hello")
```

| name | value |
| ---- | ----- |
| a    | 1     |
| b    | 2     |

See [the docs](https://example.test/docs) for more."""

# Each would set window.pwned if the page inserted the model's HTML as it came.
PAYLOAD = """Plain words first.

<script>window.pwned = "script"</script>

<img src="/missing-image.png" onerror="window.pwned = 'onerror'">

<a href="javascript:window.pwned='href'" id="bad-link">click</a> [also](javascript:window.pwned='md')"""


def said(text: str) -> str:
    return f"[emu:say={quote(text, safe='')}]"


async def finished_answer(page: Any) -> Any:
    answer = page.locator('.answer[data-done="true"] .answer-text')
    await answer.wait_for(timeout=15_000)
    return answer


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_markdown_answer_renders_as_elements(browser: Any, served: Served, transport: str) -> None:
    page = await open_page(browser, served, f"?transport={transport}")
    await ask(page, f"Show me everything {said(MARKDOWN)}")
    text = await finished_answer(page)
    assert await text.locator("h1").inner_text() == "Results"
    assert await text.locator("p strong").inner_text() == "bold"
    assert await text.locator("p > code").inner_text() == "inline code"
    assert await text.locator("ul > li").all_inner_texts() == ["first item", "second item", "third item"]
    code = text.locator("pre > code")
    assert await code.inner_text() == 'print("hello")\n'
    assert "language-python" in (await code.get_attribute("class") or "")
    assert await text.locator("table th").all_inner_texts() == ["name", "value"]
    assert await text.locator("table tbody tr").count() == 2
    assert await text.locator("table tbody tr:nth-child(2) td").all_inner_texts() == ["b", "2"]
    link = text.locator("a")
    assert await link.inner_text() == "the docs"
    assert await link.get_attribute("href") == "https://example.test/docs"
    assert await link.get_attribute("target") == "_blank"
    assert await link.get_attribute("rel") == "noopener noreferrer"
    # No Markdown syntax is left over as text.
    assert "**" not in await text.inner_text() and "```" not in await text.text_content()
    await page.close()


async def test_html_in_an_answer_is_sanitized_and_never_runs(browser: Any, served: Served) -> None:
    page = await open_page(browser, served, "?transport=ws")
    await ask(page, f"Say something nasty {said(PAYLOAD)}")
    text = await finished_answer(page)
    assert await text.locator("p").first.inner_text() == "Plain words first."
    # The image is kept without its handler; wait until the browser has tried to load it (the
    # moment its onerror would have run), then nothing has set the flag.
    image = text.locator("img")
    assert await image.count() == 1
    await page.wait_for_function("document.querySelector('.answer-text img').complete")
    assert await page.evaluate("window.pwned") is None
    assert await text.locator("script").count() == 0
    assert await page.locator("[onerror]").count() == 0
    html = await text.inner_html()
    assert "onerror" not in html and "<script" not in html and "javascript:" not in html
    for anchor in await text.locator("a").all():
        href = await anchor.get_attribute("href")
        assert href is None or not href.lower().startswith("javascript:")
        await anchor.click(modifiers=["Alt"])  # a click on what is left runs nothing either
    assert await page.evaluate("window.pwned") is None
    # The payload is live: the same Markdown inserted unsanitized does set the flag.
    await page.evaluate(
        """(source) => {
            const box = document.createElement('div');
            box.innerHTML = marked.parse(source);
            document.body.append(box);
        }""",
        PAYLOAD,
    )
    await page.wait_for_function("window.pwned === 'onerror'", timeout=5_000)
    await page.close()


async def test_a_streaming_answer_is_rendered_at_most_once_per_frame(browser: Any, make_served: Any) -> None:
    # Every delta its own event, even when the socket falls behind (no merging on the server).
    served = await make_served(merge_deltas_after=1_000_000)
    words = " ".join(f"word{i}" for i in range(400))
    page = await open_page(browser, served, "?transport=ws")
    # The test counts the animation frames itself, from before the question to the end.
    await page.evaluate(
        """() => {
            window.frames_seen = 0;
            const tick = () => { window.frames_seen += 1; requestAnimationFrame(tick); };
            requestAnimationFrame(tick);
        }"""
    )
    before = await page.evaluate("window.agentstream.markdownRenders")
    await ask(page, f"Stream it {said(words)} [emu:tps=2000] [emu:ttft=0]")
    text = await finished_answer(page)
    assert await text.inner_text() == words
    counts = await page.evaluate(
        "({renders: window.agentstream.markdownRenders, events: window.agentstream.textEvents,"
        " frames: window.frames_seen})"
    )
    renders = counts["renders"] - before
    # Every token reached the page as its own event, yet the text was parsed far fewer times:
    # at most once per frame, plus the one at the end (the answer's last text shown at once).
    assert counts["events"] == 400, counts
    assert 1 <= renders <= counts["frames"] + 1, counts
    assert renders < counts["events"] / 2, counts
    await page.close()
