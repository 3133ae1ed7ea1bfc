// Fleet and host pages: numbers that stay current between pushes, notices, and the host charts.
// - `[data-tick-base]` ({% ticking %}): a running clock — an age, a worker's busy time, a
//   phase's duration, an ETA counting down — from its value at the snapshot plus the snapshot's
//   age when rendered plus the time since the fragment arrived, so a value that has not changed
//   (an SRS entry nobody used, a partition still proving) never shows frozen; a push replaces
//   the element, which re-bases it on the newer snapshot. A fragment that spent longer on its
//   way than the quickest one seen (a busy controller or channel) adds that delay too: the
//   quickest arrival gives the server clock's offset (plus the least delivery time) without
//   assuming the two clocks agree. A clock of a machine that is not live is rendered stopped
//   (`.tick-frozen`, "as of N s ago") and never runs; while the page itself has lost its
//   connection (app.js sets html[data-page-conn=lost]) every clock stops but the ages
//   (`.tick.age`: how old a snapshot is, true whatever happens to the engine).
// - `.money[data-amount][data-per-hour]`: spend to date, growing with the running price.
// - `#toasts`: notices pushed over the page's socket (an htmx out-of-band append).
// - `.charts[data-window]`: uPlot charts drawn from the fragment's JSON series; the chosen
//   window survives the controller's pushes (which always carry the default window).
(function () {
  "use strict";
  var TOAST_MS = 20000;
  var WINDOW_KEY = "vastmgr.chart-window";
  var TRANSITS_KEPT = 50;  // the latest fragments' arrival - render times, seconds
  var charts = [];
  var transits = [];

  // Arrival minus render time of the quickest recent fragment: the server clock's offset plus
  // the least time a fragment takes to arrive.
  function quickestTransit() {
    return transits.length ? Math.min.apply(null, transits) : 0;
  }

  function fmtAge(seconds) {
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function stamp(root) {
    var now = Date.now();
    var transit = Infinity;
    root.querySelectorAll("[data-tick-base]:not([data-t0]), .money[data-amount]:not([data-t0])")
      .forEach(function (el) {
        el.setAttribute("data-t0", String(now));
        if (el.hasAttribute("data-tick-rendered")) {
          transit = Math.min(transit, now / 1000 - Number(el.getAttribute("data-tick-rendered")));
        }
      });
    if (transit !== Infinity) {
      transits.push(transit);
      if (transits.length > TRANSITS_KEPT) transits.shift();
    }
    root.querySelectorAll(".toast:not([data-t0])").forEach(function (el) {
      el.setAttribute("data-t0", String(now));
      setTimeout(function () { el.remove(); }, TOAST_MS);
    });
  }

  function tick() {
    var now = Date.now();
    var quickest = quickestTransit();
    var pageLost = document.documentElement.getAttribute("data-page-conn") === "lost";
    document.querySelectorAll("[data-tick-base][data-t0]").forEach(function (el) {
      if (pageLost && !el.classList.contains("age")) return;
      var arrived = Number(el.getAttribute("data-t0"));
      var late = el.hasAttribute("data-tick-rendered") ? Math.max(0,
        arrived / 1000 - Number(el.getAttribute("data-tick-rendered")) - quickest) : 0;
      var elapsed = Number(el.getAttribute("data-tick-age")) + late + (now - arrived) / 1000;
      var base = Number(el.getAttribute("data-tick-base"));
      var value = el.hasAttribute("data-tick-down") ? Math.max(0, base - elapsed) : base + elapsed;
      var digits = Number(el.getAttribute("data-tick-digits"));
      el.textContent = digits ? value.toFixed(digits) + " s" : fmtAge(value);
    });
    document.querySelectorAll(".money[data-t0]").forEach(function (el) {
      var hours = (now - Number(el.getAttribute("data-t0"))) / 3600000;
      var amount = Number(el.getAttribute("data-amount")) + Number(el.getAttribute("data-per-hour")) * hours;
      el.textContent = "$" + amount.toFixed(2);
    });
  }

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  var SERIES = {
    rate: { label: "proofs/min", axis: "proofs/min", unit: " /min", digits: 2, colour: ["--chart-rate", "#2b6cb0"] },
    busy: { label: "GPU busy", axis: "GPU busy %", unit: " %", digits: 1, colour: ["--chart-busy", "#dd6b20"] }
  };

  // A value with no value beside it (a window's only sample so far, one after a gap) is no
  // line: drawn as a dot, or the chart would look empty while it has a point.
  function lonePoints(u, seriesIdx) {
    var values = u.data[seriesIdx], lone = [];
    for (var i = 0; i < values.length; i++) {
      if (values[i] != null && values[i - 1] == null && values[i + 1] == null) lone.push(i);
    }
    return lone.length ? lone : null;
  }

  function drawCharts() {
    charts = charts.filter(function (c) {
      if (c.el.isConnected) return true;
      resizer.unobserve(c.plot.root.parentNode);
      c.plot.destroy();
      return false;
    });
    document.querySelectorAll(".charts[data-window]:not([data-drawn])").forEach(function (el) {
      el.setAttribute("data-drawn", "1");
      var chosen = chosenWindow();
      if (chosen && chosen !== el.getAttribute("data-window") && window.htmx) {
        loadWindow(el, chosen);  // rendered or polled with the default window
        return;
      }
      var script = el.querySelector("script[type='application/json']");
      if (!script || !window.uPlot) return;
      var data = JSON.parse(script.textContent);
      var fg = cssVar("--fg", "#1d2330"), grid = cssVar("--line", "#dfe3ea");
      el.querySelectorAll("figure[data-series]").forEach(function (figure) {
        var key = figure.getAttribute("data-series");
        var spec = SERIES[key];
        var target = figure.querySelector(".plot");
        var axis = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
        var plot = new window.uPlot({
          width: Math.max(target.clientWidth, 240),
          height: 170,
          scales: {
            x: { time: true, range: function () { return [data.start, data.end]; } },
            y: { range: key === "busy" ? [0, 100]
                 : function (u, min, max) { return [0, Math.max(1, (max || 0) * 1.15)]; } }
          },
          axes: [
            Object.assign({ label: "time (local)", labelSize: 16 }, axis),
            Object.assign({ label: spec.axis, labelSize: 16, size: 48 }, axis)
          ],
          series: [
            { label: "time" },
            { label: spec.label, stroke: cssVar(spec.colour[0], spec.colour[1]), width: 1.5,
              spanGaps: false, points: { show: false, size: 7, filter: lonePoints },
              value: function (u, v) { return v == null ? "—" : v.toFixed(spec.digits) + spec.unit; } }
          ]
        }, [data.t, data[key]], target);
        target._uplot = plot;  // lets tests and the console read what was drawn
        charts.push({ el: el, plot: plot });
        resizer.observe(target);
      });
    });
  }

  // Follow the layout (a narrow screen stacks the charts): keep each plot as wide as its box.
  var resizer = new ResizeObserver(function (entries) {
    entries.forEach(function (entry) {
      var plot = entry.target._uplot;
      var width = Math.max(Math.floor(entry.contentRect.width), 240);
      if (plot && Math.abs(plot.width - width) > 1) plot.setSize({ width: width, height: plot.height });
    });
  });

  var pending = false;
  function refresh() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () {
      pending = false;
      stamp(document);
      drawCharts();
    });
  }

  function chosenWindow() {
    return sessionStorage.getItem(WINDOW_KEY);
  }

  function loadWindow(el, key) {
    window.htmx.ajax("GET", el.getAttribute("data-url") + "?window=" + encodeURIComponent(key),
                     { source: el, target: el, swap: "outerHTML" });
  }

  // A pushed chart carries the default window: when another one is chosen, keep the drawn chart
  // until that window's fresh data has arrived, instead of flashing the default in between.
  function keepChosenWindow(event) {
    var target = event.detail.target;
    if (!target.matches || !target.matches(".charts[data-window]")) return;
    var fresh = event.detail.fragment.firstElementChild;
    var chosen = chosenWindow();
    if (fresh && chosen && fresh.getAttribute("data-window") !== chosen) {
      event.detail.shouldSwap = false;
      loadWindow(target, chosen);
    }
  }

  function setup() {
    document.addEventListener("htmx:oobBeforeSwap", keepChosenWindow);
    var param = new URLSearchParams(location.search).get("window");
    if (param) sessionStorage.setItem(WINDOW_KEY, param);
    document.addEventListener("click", function (event) {
      var link = event.target.closest && event.target.closest(".window-picker a[data-window]");
      if (link) sessionStorage.setItem(WINDOW_KEY, link.getAttribute("data-window"));
      var close = event.target.closest && event.target.closest(".toast-close");
      if (close) close.parentElement.remove();
    });
    new MutationObserver(refresh).observe(document.body, { childList: true, subtree: true });
    refresh();
    setInterval(tick, 1000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setup);
  else setup();
})();
