"""The run viewer in headless Chromium (Debian's `chromium`, driven by Playwright): a finished team run shows
every step and child run; a message sent from the page streams its answer in; a reload mid-run shows no row
twice; a pending approval is approved (conversation) or denied (run view) with a click. Screenshots are
saved under each test's temporary directory."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

playwright_api = pytest.importorskip("playwright.async_api")

from tests.server import support  # noqa: E402
from tests.server.support import TEAM, A, Env, bearer  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium for this test")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = await browser.new_context(viewport={"width": 1280, "height": 860})
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # the page runs under its Content-Security-Policy (SEC7c): any violation fails the test
        page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
        try:
            yield page
        finally:
            await page.screenshot(path=str(tmp_path / "last.png"))
            await browser.close()
        assert errors == [], errors


def walk(run: dict[str, Any]) -> list[dict[str, Any]]:
    out = [run]
    for child in run["children"]:
        out.extend(walk(child))
    return out


async def test_the_viewer_shows_every_step_and_child_run_of_a_finished_team_run(
    make_env: Any, page: Any, tmp_path: Path
) -> None:
    env: Env = await make_env(definitions=TEAM)
    base = await env.live()
    agent = (await env.http.post("/v1/agents", json={"definition": "orchestrator"}, headers=bearer(A))).json()
    await env.http.post(
        f"/v1/agents/{agent['id']}/messages",
        json={"content": "Write a short brief about durable agents"},
        headers=bearer(A),
    )
    await env.idle(agent["id"])
    (root,) = (await env.http.get("/v1/runs", params={"roots": "true"}, headers=bearer(A))).json()["items"]
    tree = (await env.http.get(f"/v1/runs/{root['id']}/tree", headers=bearer(A))).json()

    await page.goto(f"{base}/ui")
    await page.fill("#token", A)  # tokens are configured: the viewer asks for one, once
    await page.click("#login-form button")
    await page.click(f"tr[data-run='{root['id']}']")
    await page.wait_for_selector(".waterfall")
    runs = walk(tree)
    steps = [s for r in runs for s in r["steps"]]
    assert len(runs) == 4 and len(steps) > 10
    for run in runs:
        await page.wait_for_selector(f".row.run[data-run='{run['id']}']")
    shown = await page.eval_on_selector_all(".row.step", "rows => rows.map(r => r.dataset.step)")
    assert sorted(shown) == sorted(s["id"] for s in steps)  # every step once, children's included
    sub = next(s for s in tree["steps"] if s["type"] == "sub_agent")
    await page.click(f".row.step[data-step='{sub['id']}']")
    detail = await page.text_content(".detail")
    assert detail is not None and sub["input"]["request"] in detail and "Findings" in detail
    await page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    if os.environ.get("STEAD_VIEWER_SCREENSHOT"):
        shutil.copy(tmp_path / "run.png", os.environ["STEAD_VIEWER_SCREENSHOT"])


async def test_a_message_sent_from_the_page_streams_its_answer_in(
    make_env: Any, page: Any, tmp_path: Path
) -> None:
    env: Env = await make_env(tokens=None)
    env.model.text = "Streaming, one delta at a time, straight into the page."
    env.model.mid = asyncio.Event()
    base = await env.live()
    agent = await env.agent(secret="")
    await page.goto(f"{base}/ui#/agents/{agent['id']}")
    await page.wait_for_selector("#message")
    await page.fill("#message", "Say something")
    await page.click("#send")
    # the first delta is on the page while the block is still open (the model paused after it)
    await page.wait_for_selector(".msg.streaming")
    await env.model.mid_reached.wait()
    partial = await page.text_content(".msg.streaming")
    assert partial is not None and env.model.text[: env.model.chunk] in partial
    assert env.model.text not in partial
    await page.screenshot(path=str(tmp_path / "streaming.png"))
    env.model.mid.set()
    await page.wait_for_selector(f".msg.assistant:not(.streaming) >> text={env.model.text}")
    assert await page.locator(".msg.streaming").count() == 0
    assert await page.locator(".msg.user >> text=Say something").count() == 1  # consumed, shown once
    await page.wait_for_selector("#state >> text=idle")
    await page.screenshot(path=str(tmp_path / "conversation.png"))


async def test_a_reload_mid_run_shows_no_row_twice(make_env: Any, page: Any, tmp_path: Path) -> None:
    env: Env = await make_env(tokens=None)
    env.model.calls = 3
    env.model.holds[2] = asyncio.Event()
    base = await env.live()
    agent = await env.agent(secret="", tools=["add"])
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "go"})
    await env.model.reached(2).wait()
    (run,) = (await env.http.get("/v1/runs")).json()["items"]
    await page.goto(f"{base}/ui#/runs/{run['id']}")
    await page.wait_for_selector(".live")
    before = await page.eval_on_selector_all(".row.step", "rows => rows.map(r => r.dataset.step)")
    await page.reload()
    await page.wait_for_selector(".live")
    again = await page.eval_on_selector_all(".row.step", "rows => rows.map(r => r.dataset.step)")
    assert again == before and len(set(again)) == len(again)
    env.model.holds[2].set()  # the run goes on; the page follows it live to its end
    await page.wait_for_selector(".row.run .status.completed")
    await env.idle(agent["id"])
    steps = (await env.http.get(f"/v1/runs/{run['id']}/steps")).json()["items"]
    await page.wait_for_function(f"document.querySelectorAll('.row.step').length === {len(steps)}")
    final = await page.eval_on_selector_all(".row.step", "rows => rows.map(r => r.dataset.step)")
    assert final == [s["id"] for s in steps]
    await page.screenshot(path=str(tmp_path / "reloaded.png"))


async def test_a_pending_approval_is_approved_from_the_conversation_and_the_answer_streams_in(
    make_env: Any, page: Any, tmp_path: Path
) -> None:
    support.TRANSFERS.clear()
    env: Env = await make_env(tokens=None)
    env.model.tool, env.model.calls = "transfer", 1
    env.model.text = "The transfer went through."
    base = await env.live()
    agent = await env.agent(secret="", tools=["transfer"])
    await page.goto(f"{base}/ui#/agents/{agent['id']}")
    await page.wait_for_selector("#message")
    await page.fill("#message", "Pay account 1")
    await page.click("#send")
    # the request arrives live (approval_requested) as a card with Approve / Deny; nothing ran yet
    card = page.locator(".approval[data-status='pending']")
    await card.wait_for()
    assert "transfer" in (await card.text_content() or "")
    await page.wait_for_selector("#state >> text=waiting")
    assert support.TRANSFERS == []
    await page.screenshot(path=str(tmp_path / "approval.png"))
    await page.fill(".approval .approval-reason", "fine by me")
    await page.click(".approval button.approve")
    await page.wait_for_selector(".approval[data-status='approved'] >> text=approved")
    await page.wait_for_selector(f".msg.assistant >> text={env.model.text}")
    await page.wait_for_selector("#state >> text=idle")
    assert support.TRANSFERS == [(0, 1)]  # the call ran once, after the click
    (stored,) = await env.system.approvals(status="approved")
    assert stored.note == "fine by me"
    await page.screenshot(path=str(tmp_path / "approved.png"))


async def open_run_awaiting_approval(make_env: Any, page: Any) -> dict[str, Any]:
    """A run whose one `transfer` call waits for a decision, open in the run view (which follows it live)."""
    support.TRANSFERS.clear()
    env: Env = await make_env(tokens=None)
    env.model.tool, env.model.calls = "transfer", 1
    base = await env.live()
    agent = await env.agent(secret="", tools=["transfer"])
    await env.http.post(f"/v1/agents/{agent['id']}/messages", json={"content": "pay"})
    await env.idle(agent["id"])
    (run,) = (await env.http.get("/v1/runs")).json()["items"]
    await page.goto(f"{base}/ui#/runs/{run['id']}")
    await page.wait_for_selector(".live")  # waiting for a decision is not settled: the page follows it
    return dict(run)


async def test_a_pending_approval_shows_in_the_run_view_and_deny_settles_the_run(
    make_env: Any, page: Any, tmp_path: Path
) -> None:
    run = await open_run_awaiting_approval(make_env, page)
    assert run["status"] == "awaiting_input"
    await page.click(".approval[data-status='pending'] button.deny")
    await page.wait_for_selector(".row.run .status.completed")
    await page.wait_for_selector(".approval[data-status='rejected'] >> text=denied")
    assert support.TRANSFERS == []
    await page.screenshot(path=str(tmp_path / "denied.png"))


async def test_an_approval_card_survives_the_run_view_re_rendering(make_env: Any, page: Any) -> None:
    """Every live event re-renders the run view; the pending approval's card is the same element after it
    (so a click cannot fall between an old and a new button), and deciding through it still works."""
    await open_run_awaiting_approval(make_env, page)
    await page.evaluate("document.querySelector('.approval').dataset.marker = 'before'")
    await page.evaluate("runView(runState.id, true)")  # what each live event does
    assert await page.evaluate("document.querySelectorAll('.approval').length") == 1
    await page.wait_for_selector(".approval[data-marker='before'][data-status='pending']")
    await page.click(".approval[data-marker='before'] button.deny")
    await page.wait_for_selector(".row.run .status.completed")
    await page.wait_for_selector(".approval[data-marker='before'][data-status='rejected']")
    assert support.TRANSFERS == []
