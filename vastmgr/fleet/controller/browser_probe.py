"""What a real browser pays for a page under load: one page in headless Chromium, measured
with the DevTools protocol while a benchmark runs.

- main-thread busy share: the renderer's `TaskDuration` (Performance.getMetrics) over the
  wall time measured;
- long tasks: every task over 50 ms (the browser's `longtask` entries), their count and the
  longest;
- bytes received per second over the page's websockets (Network.webSocketFrameReceived).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a development dependency, imported by the benchmark only when asked for
    from playwright.async_api import Browser, CDPSession, Page

# Installed before any page script, so no long task goes unobserved.
OBSERVE_LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver(function (list) {
  list.getEntries().forEach(function (entry) { window.__longTasks.push(entry.duration); });
}).observe({type: "longtask", buffered: true});
"""


class BrowserProbe:
    def __init__(self, name: str):
        self.name = name
        self.bytes = 0
        self.page: Page
        self.cdp: CDPSession
        self.started = (0.0, 0.0, 0)  # (wall clock, task seconds, bytes) when measuring began

    async def open(self, browser: Browser, url: str, cookie: dict) -> None:
        context = await browser.new_context()
        await context.add_cookies([cookie])  # type: ignore[list-item]
        await context.add_init_script(OBSERVE_LONG_TASKS)
        self.page = await context.new_page()
        self.cdp = await context.new_cdp_session(self.page)
        await self.cdp.send("Performance.enable")
        await self.cdp.send("Network.enable")
        self.cdp.on("Network.webSocketFrameReceived", self._frame)
        await self.page.goto(url, wait_until="load")

    def _frame(self, event: dict) -> None:
        self.bytes += len(event.get("response", {}).get("payloadData", ""))

    async def _task_seconds(self) -> float:
        metrics = (await self.cdp.send("Performance.getMetrics"))["metrics"]
        return next(m["value"] for m in metrics if m["name"] == "TaskDuration")

    async def start(self) -> None:
        await self.page.evaluate("window.__longTasks = []")
        self.started = (time.monotonic(), await self._task_seconds(), self.bytes)

    async def stop(self) -> dict:
        wall = time.monotonic() - self.started[0]
        busy = await self._task_seconds() - self.started[1]
        long_tasks = await self.page.evaluate("window.__longTasks")
        rows = await self.page.locator("#fleet-rows tr").count()
        return {
            "page": self.name, "seconds": round(wall, 1),
            "main_thread_busy_percent": round(100 * busy / wall, 1),
            "long_tasks": len(long_tasks),
            "longest_task_ms": round(max(long_tasks, default=0.0)),
            "kilobytes_per_second": round((self.bytes - self.started[2]) / wall / 1000, 1),
            "fleet_rows_in_dom": rows,
        }
