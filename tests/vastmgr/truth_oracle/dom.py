"""What a person sees, read from the DOM in one `page.evaluate`: the fleet row, the host panel
or the proof page as plain JSON for `rules`. The machine-readable data attributes are read when
the page carries them (data-job, data-partition, data-phase, data-worker, data-worker-state,
data-host-stale, data-job-status); otherwise the classes and the visible text. Running clocks
are always read from the visible text: that is what a person reads."""

from __future__ import annotations

EXTRACT = r"""
(arg) => {
  const traceback = (document.body.textContent || "").includes("Traceback (most recent call last)");
  const read = (view) => Object.assign(view, {traceback});
  // Clocks of the view's data: running (fleet.js moves them) and stopped ones without their
  // "as of" (a snapshot's age, class "age", is not the data's and always runs).
  const clocks = (root) => ({
    running: root ? root.querySelectorAll(".tick:not(.age)").length : 0,
    unlabelled: root ? [...root.querySelectorAll(".tick-frozen")].filter(
      el => !(el.nextElementSibling && el.nextElementSibling.classList.contains("as-of"))).length : 0});
  const num = (text, re) => { const m = (text || "").match(re); return m ? parseFloat(m[1]) : null; };
  const phaseOf = (el, prefix) => {
    if (el.dataset.phase) return el.dataset.phase;
    for (const c of el.classList) if (c.startsWith(prefix)) return c.slice(prefix.length);
    return null;
  };
  const cellsIn = (root) => [...root.querySelectorAll(".cells .cell, .cell[data-partition]")]
    .filter((el, i, all) => all.indexOf(el) === i)
    .map(el => ({index: el.dataset.partition !== undefined ? parseInt(el.dataset.partition)
                                                             : num(el.textContent, /P(\d+)/),
                 phase: phaseOf(el, "phase-")}));
  const stale = (root) => {
    const flag = root.closest("[data-host-stale]") || root.querySelector("[data-host-stale]");
    if (flag && ["1", "true", "yes"].includes(flag.dataset.hostStale)) return true;
    const conn = root.querySelector("[data-conn]");
    return conn ? conn.dataset.conn !== "live" : false;
  };
  const labelOf = (el) => {
    if (!el) return null;
    if (el.dataset.phase) return el.dataset.phase;
    if (el.dataset.jobStatus) return el.dataset.jobStatus;
    return phaseOf(el, "status-");
  };
  if (arg.kind === "fleet") {
    const row = document.getElementById(`host-${arg.host}-row`);
    if (!row) return {kind: "fleet", page: "fleet row", missing: true};
    const workers = row.querySelector(".workers-cell");
    const wtext = workers ? workers.textContent : "";
    const waiting = row.querySelector(".waiting-jobs");
    const parts = row.querySelector(".waiting-parts");
    const seq = row.dataset.seq ? parseInt(row.dataset.seq) : null;
    return read({kind: "fleet", page: "fleet row", stale: stale(row), seq, clocks: clocks(row), figures: {
      busy_workers: num(wtext, /(\d+)\s*busy/), idle_workers: num(wtext, /(\d+)\s*idle/),
      waiting_jobs: waiting ? num(waiting.textContent, /(\d+)/) : null,
      parts_ready: waiting ? (parts ? num(parts.textContent, /(\d+)/) : 0) : null}});
  }
  if (arg.kind === "host") {
    const panel = document.getElementById(`host-${arg.host}-panel`);
    if (!panel) return {kind: "host", page: "host panel", missing: true};
    const card = (title) => [...panel.querySelectorAll(".card")]
      .find(c => (c.querySelector("h3") || {}).textContent?.startsWith(title));
    const synth = card("Synthesis"), counters = card("Counters"), memory = card("Memory");
    const ctext = counters ? counters.textContent : "";
    const pipelines = [...panel.querySelectorAll(".pipeline")].map(p => ({
      job: p.dataset.job || p.id.replace(/^host-\d+-job-/, ""),
      phase: p.dataset.phase || labelOf(p.querySelector(".status")),
      cells: cellsIn(p)}));
    const workers = [...panel.querySelectorAll(".worker")].map(w => {
      const text = w.textContent;
      const state = w.dataset.workerState || phaseOf(w, "worker-");
      const code = w.querySelector("code");
      return {worker: w.dataset.worker !== undefined ? parseInt(w.dataset.worker) : num(text, /W(\d+)/),
              state, job: state === "proving" ? (w.dataset.job || (code ? code.textContent.trim() : null)) : null,
              partition: state === "proving" ? (w.dataset.partition !== undefined ? parseInt(w.dataset.partition) : num(text, /P(\d+)/)) : null,
              busy_s: state === "proving" ? num(text, /P\d+\s*·\s*([\d.]+)\s*s/) : null,
              busy_total_s: num(text, /busy total\s*([\d.]+)\s*s/)};
    });
    const memText = memory ? (memory.querySelector("small") || memory).textContent : "";
    const seq = panel.dataset.snapshotSeq ? parseInt(panel.dataset.snapshotSeq) : null;
    return read({kind: "host", page: "host panel", stale: stale(panel), seq, pipelines, workers,
                 clocks: clocks(panel), figures: {
      synthesis_active: synth ? num(synth.textContent, /(\d+)\s*\//) : null,
      done: num(ctext, /(\d+)\s*done/), failed: num(ctext, /(\d+)\s*failed/),
      cancelled: num(ctext, /(\d+)\s*cancelled/),
      not_started: num(ctext, /\((\d+)\s*not started/),
      memory_used: memText.includes("used") ? memText.split("used")[0] : null}});
  }
  const section = document.getElementById(`proof-${arg.job}`);
  if (!section) return {kind: "proof", page: "proof page", job: arg.job, missing: true};
  const status = document.getElementById(`proof-${arg.job}-status`);
  return read({kind: "proof", page: "proof page", job: arg.job, stale: stale(section),
               clocks: clocks(section),
               status: section.dataset.jobStatus || null, phase: labelOf(status),
               cells: cellsIn(section)});
}
"""
