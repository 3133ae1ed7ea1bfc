// Live panels: badge from the htmx ws extension's events, and while the page's socket is
// down, poll the same fragments over HTTP every 5 s so the page never silently freezes. Every
// socket on the page (the page's own, an open fleet row's) reconnects with backoff after a
// clean close too: the extension itself only retries 1006/1011/1012/1013.
// While the socket is down and no poll has come back, the page has lost its connection: nothing
// on it is known to be current, so every machine's state reads "unknown" (its badge, and the
// data-conn of its row and panel) and fleet.js stops every running clock but the ages of the
// snapshots shown. A (re)connected socket sends the whole page again first, which replaces it.
(function () {
  "use strict";
  var POLL_MS = 5000;
  var MAX_BACKOFF_MS = 30000;
  var NO_RETRY = { 4403: "logged out", 4404: "not found" };

  var lostSince = null;  // Date.now() when the page lost its connection; null while it has one

  // Lost: every machine's state on the page reads "unknown". Found again: the socket that
  // reconnected sends the whole page first, which replaces each of them with the state now.
  function pageConnection(lost) {
    var root = document.documentElement;
    if (lost && lostSince === null) {
      lostSince = Date.now();
      root.setAttribute("data-page-conn", "lost");
      document.querySelectorAll("[data-conn]").forEach(function (el) {
        var known = el.getAttribute("data-conn");
        el.setAttribute("data-conn", "unknown");
        el.classList.replace("conn-" + known, "conn-unknown");
        if (el.classList.contains("badge")) {
          el.classList.replace("badge-" + known, "badge-unknown");
          el.textContent = "unknown";
          el.title = "This page lost its connection: the machine's state now is not known";
        }
      });
      tickSeen();
    } else if (!lost && lostSince !== null) {
      lostSince = null;
      root.removeAttribute("data-page-conn");
    }
  }

  function badge(state, text) {
    var el = document.getElementById("connection-badge");
    if (!el) return;
    el.className = "badge badge-" + state;
    el.textContent = text;
  }

  // Swap every top-level element of an HTML string into the element with the same id,
  // exactly what the ws extension does with a pushed message, htmx:oobBeforeSwap included:
  // the pages' own handlers (an open fleet row's detail stepping aside, a chart keeping its
  // chosen window) see a polled fragment as they see a pushed one.
  function swapFragments(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    Array.prototype.slice.call(template.content.children).forEach(function (fresh) {
      var old = fresh.id && document.getElementById(fresh.id);
      if (!old) return;
      var fragment = document.createDocumentFragment();
      fragment.appendChild(fresh);
      var swap = { shouldSwap: true, target: old, fragment: fragment };
      if (window.htmx && !window.htmx.trigger(old, "htmx:oobBeforeSwap", swap)) return;
      if (!swap.shouldSwap) return;
      swap.target.replaceWith(fragment);
      if (window.htmx) window.htmx.process(fresh);
    });
    markArrival(document);
  }

  // "last seen N s ago" keeps counting in the browser between pushes, so a silent controller
  // shows as ever-older data rather than as a frozen "1 s ago".
  function markArrival(root) {
    var now = Date.now();
    root.querySelectorAll(".seen[data-ago]:not([data-t0])").forEach(function (el) {
      el.setAttribute("data-t0", String(now));
    });
  }

  function tickSeen() {
    var now = Date.now();
    if (lostSince !== null) {
      var offline = Math.floor((now - lostSince) / 1000);
      document.querySelectorAll(".seen").forEach(function (el) {
        el.textContent = "this page has been offline " + offline + " s";
      });
      return;
    }
    document.querySelectorAll(".seen[data-ago][data-t0]").forEach(function (el) {
      var ago = Number(el.getAttribute("data-ago")) +
        Math.floor((now - Number(el.getAttribute("data-t0"))) / 1000);
      el.textContent = "last seen " + ago + " s ago";
    });
  }

  function LivePanel(el) {
    this.el = el;
    this.pollUrl = el.getAttribute("data-poll-url");
    this.timer = null;
    this.polled = false;  // the latest poll came back: the page is current, if late
  }

  LivePanel.prototype.startPolling = function () {
    var self = this;
    if (self.timer || !self.pollUrl) return;
    self.timer = setInterval(function () { self.poll(); }, POLL_MS);
    self.poll();
  };

  LivePanel.prototype.stopPolling = function () {
    clearInterval(this.timer);
    this.timer = null;
    this.polled = false;
  };

  LivePanel.prototype.poll = function () {
    var self = this;
    fetch(self.pollUrl, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (response) {
        if (response.redirected || response.status === 401 || response.status === 403) {
          self.stopPolling();
          badge("offline", "logged out");
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (html !== null && self.timer) {
          pageConnection(false);
          swapFragments(html);
          self.polled = true;
          badge("stale", "polling");
        }
      })
      .catch(function () {
        self.polled = false;
        pageConnection(true);
        badge("offline", "offline");
      });
  };

  // A clean close (daphne restart, deploy): the extension would give up, we do not. Counted
  // per socket element; a socket whose element left the page (a closed row) stays closed.
  var cleanCloses = new WeakMap();

  function closeCode(event) { return event.detail.event && event.detail.event.code; }

  function reconnectAfterCleanClose(event) {
    var code = closeCode(event);
    if ((code !== 1000 && code !== 1001) || !event.target.isConnected) return;
    var retries = cleanCloses.get(event.target) || 0;
    cleanCloses.set(event.target, retries + 1);
    var delay = Math.min(MAX_BACKOFF_MS, 1000 * Math.pow(2, retries)) * Math.random();
    setTimeout(function () {
      if (event.target.isConnected) event.detail.socketWrapper.reconnect();
    }, delay);
  }

  // While polls come back, the badge says "polling" however often a reconnect fails.
  function socketDown(panel) {
    if (!panel.polled) {
      pageConnection(true);
      badge("offline", "reconnecting");
    }
    panel.startPolling();
  }

  // The page's own socket drives the badge and the polling. Events of a socket inside it (an
  // open fleet row's panel) bubble up to it too, and are not about it.
  function watchPanel(el) {
    var panel = new LivePanel(el);
    function own(handler) {
      return function (event) { if (event.target === el) handler(event); };
    }
    el.addEventListener("htmx:wsConnecting", own(function () {
      if (!panel.timer) badge("idle", "connecting…");
    }));
    el.addEventListener("htmx:wsOpen", own(function () {
      pageConnection(false);
      panel.stopPolling();
      badge("live", "live");
    }));
    el.addEventListener("htmx:wsAfterMessage", function () { markArrival(document); });
    el.addEventListener("htmx:wsClose", own(function (event) {
      var code = closeCode(event);
      if (NO_RETRY[code]) {
        panel.stopPolling();
        pageConnection(true);
        badge("offline", NO_RETRY[code]);
        return;
      }
      socketDown(panel);
    }));
    el.addEventListener("htmx:wsError", own(function () { socketDown(panel); }));
  }

  function setup() {
    markArrival(document);
    setInterval(tickSeen, 1000);
    document.addEventListener("htmx:wsOpen", function (event) { cleanCloses.delete(event.target); });
    document.addEventListener("htmx:wsClose", reconnectAfterCleanClose);
    document.querySelectorAll(".live[ws-connect]").forEach(watchPanel);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setup);
  else setup();
})();
