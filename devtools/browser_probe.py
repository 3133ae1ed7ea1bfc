"""What a real browser pays for a page under load: one page in headless Chromium, measured
with the DevTools protocol while a benchmark runs.

- main-thread busy share: the renderer's `TaskDuration` (Performance.getMetrics) over the
  wall time measured;
- long tasks: every task over 50 ms (the browser's `longtask` entries), their count and the
  longest;
- bytes received per second over the page's websockets (Network.webSocketFrameReceived);
- with `trace` (one page of a browser at a time), what each long task spent its time on: a
  DevTools timeline trace of the measured span, its renderer main-thread tasks over 50 ms broken down by the timeline's own
  event names (parsing, style, layout, script, garbage collection).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a development dependency, imported by the benchmark only when asked for
    from playwright.async_api import Browser, CDPSession, Page

# Installed before any page script, so no long task goes unobserved. Each pushed message's
# handling (the ws extension's swaps, between its before- and after-message events) is timed
# too, with how many rows it carried and whether it was a whole page.
OBSERVE_LONG_TASKS = """
window.__longTasks = [];
window.__messages = [];
new PerformanceObserver(function (list) {
  list.getEntries().forEach(function (entry) { window.__longTasks.push(entry.duration); });
}).observe({type: "longtask", buffered: true});
var messageStarted = 0;
document.addEventListener("htmx:wsBeforeMessage", function () {
  messageStarted = performance.now();
});
document.addEventListener("htmx:wsAfterMessage", function (event) {
  var text = String(event.detail.message);
  window.__messages.push({ms: performance.now() - messageStarted, bytes: text.length,
                          rows: text.split('-row" class=').length - 1,
                          whole: text.indexOf('id="fleet-rows"') >= 0});
});
"""
SLOWEST_MESSAGES = 5


# What a timeline trace records: tasks and their timeline events (parse, style, layout, script).
TRACE_CATEGORIES = "devtools.timeline,disabled-by-default-devtools.timeline,v8"
LONG_TASK_MS = 50
# The timeline events a long task is broken down by (the rest are containers of these).
TASK_PARTS = ("ParseHTML", "UpdateLayoutTree", "Layout", "FunctionCall", "EvaluateScript",
              "EventDispatch", "TimerFire", "MajorGC", "MinorGC", "Paint", "PrePaint",
              "Layerize", "HitTest", "v8.run")


class BrowserProbe:
    def __init__(self, name: str, trace: bool = False):
        self.name = name
        self.trace = trace
        self.trace_events: list[dict] = []
        self.trace_done = asyncio.Event()
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
        self.cdp.on("Tracing.dataCollected", lambda event: self.trace_events.extend(
            event.get("value", [])))
        self.cdp.on("Tracing.tracingComplete", lambda _event: self.trace_done.set())
        await self.page.goto(url, wait_until="load")

    def _frame(self, event: dict) -> None:
        self.bytes += len(event.get("response", {}).get("payloadData", ""))

    async def _task_seconds(self) -> float:
        metrics = (await self.cdp.send("Performance.getMetrics"))["metrics"]
        return next(m["value"] for m in metrics if m["name"] == "TaskDuration")

    async def start(self) -> None:
        await self.page.evaluate("window.__longTasks = []; window.__messages = []")
        if self.trace:
            await self.cdp.send("Tracing.start", {"categories": TRACE_CATEGORIES,
                                                  "transferMode": "ReportEvents"})
        self.started = (time.monotonic(), await self._task_seconds(), self.bytes)

    async def stop(self) -> dict:
        wall = time.monotonic() - self.started[0]
        busy = await self._task_seconds() - self.started[1]
        long_tasks = await self.page.evaluate("window.__longTasks")
        messages = await self.page.evaluate("window.__messages")
        rows = await self.page.locator("#fleet-rows tr").count()
        result = {
            "page": self.name, "seconds": round(wall, 1),
            "main_thread_busy_percent": round(100 * busy / wall, 1),
            "long_tasks": len(long_tasks),
            "longest_task_ms": round(max(long_tasks, default=0.0)),
            "kilobytes_per_second": round((self.bytes - self.started[2]) / wall / 1000, 1),
            "fleet_rows_in_dom": rows,
            "messages": len(messages),
            "slowest_messages": [{**m, "ms": round(m["ms"])} for m in sorted(
                messages, key=lambda m: -m["ms"])[:SLOWEST_MESSAGES]],
        }
        if self.trace:
            await self.cdp.send("Tracing.end")
            await asyncio.wait_for(self.trace_done.wait(), 60)
            result["long_task_parts"] = long_task_parts(self.trace_events)
        return result


def long_task_parts(events: list[dict]) -> list[dict]:
    """The renderer main thread's tasks over `LONG_TASK_MS` in a timeline trace, longest
    first: each one's length and the milliseconds of each `TASK_PARTS` event inside it (an
    event nested in another of the same name counted once)."""
    main = {(e["pid"], e["tid"]) for e in events
            if e.get("name") == "thread_name" and e.get("args", {}).get("name")
            == "CrRendererMain"}
    timed = sorted((e for e in events if (e.get("pid"), e.get("tid")) in main
                    and e.get("ph") == "X" and "dur" in e), key=lambda e: e["ts"])
    tasks = [e for e in timed if e["name"] == "RunTask" and e["dur"] >= LONG_TASK_MS * 1000]
    report = []
    for task in sorted(tasks, key=lambda e: -e["dur"])[:10]:
        end = task["ts"] + task["dur"]
        parts: Counter[str] = Counter()
        covered: dict[str, float] = {}  # event name -> end of the last one counted
        for event in timed:
            if not task["ts"] <= event["ts"] < end or event["name"] not in TASK_PARTS:
                continue
            if event["ts"] < covered.get(event["name"], 0):
                continue  # inside one of its own name already counted
            covered[event["name"]] = event["ts"] + event["dur"]
            parts[event["name"]] += event["dur"] / 1000
        report.append({"ms": round(task["dur"] / 1000),
                       "parts_ms": {name: round(ms) for name, ms in parts.most_common()}})
    return report
