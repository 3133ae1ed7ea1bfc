// Live panels: badge from the htmx ws extension's events, reconnect with backoff after clean
// closes (the extension itself only retries 1006/1011/1012/1013), and while the socket is
// down, poll the same fragments over HTTP every 5 s so the page never silently freezes.
(function () {
  "use strict";
  var POLL_MS = 5000;
  var MAX_BACKOFF_MS = 30000;
  var NO_RETRY = { 4403: "logged out", 4404: "not found" };

  function badge(state, text) {
    var el = document.getElementById("connection-badge");
    if (!el) return;
    el.className = "badge badge-" + state;
    el.textContent = text;
  }

  // Swap every top-level element of an HTML string into the element with the same id,
  // exactly what the ws extension does with a pushed message.
  function swapFragments(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    Array.prototype.forEach.call(template.content.children, function (fresh) {
      var old = fresh.id && document.getElementById(fresh.id);
      if (!old) return;
      old.replaceWith(fresh);
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
    this.retries = 0;
    this.stopped = false;
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
  };

  LivePanel.prototype.poll = function () {
    var self = this;
    fetch(self.pollUrl, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (response) {
        if (response.redirected || response.status === 401 || response.status === 403) {
          self.stopped = true;
          self.stopPolling();
          badge("offline", "logged out");
          return null;
        }
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (html !== null && self.timer) {
          swapFragments(html);
          badge("stale", "polling");
        }
      })
      .catch(function () { badge("offline", "offline"); });
  };

  function setup() {
    markArrival(document);
    setInterval(tickSeen, 1000);
    document.querySelectorAll(".live[ws-connect]").forEach(function (el) {
      var panel = new LivePanel(el);
      el.addEventListener("htmx:wsConnecting", function () {
        if (!panel.timer) badge("idle", "connecting…");
      });
      el.addEventListener("htmx:wsOpen", function () {
        panel.retries = 0;
        panel.stopPolling();
        badge("live", "live");
      });
      el.addEventListener("htmx:wsAfterMessage", function () { markArrival(document); });
      el.addEventListener("htmx:wsClose", function (event) {
        var code = event.detail.event && event.detail.event.code;
        if (NO_RETRY[code]) {
          panel.stopped = true;
          panel.stopPolling();
          badge("offline", NO_RETRY[code]);
          return;
        }
        badge("offline", "reconnecting");
        panel.startPolling();
        if (code === 1000 || code === 1001) {
          // A clean close (daphne restart, deploy): the extension would give up, we do not.
          var delay = Math.min(MAX_BACKOFF_MS, 1000 * Math.pow(2, panel.retries++)) * Math.random();
          setTimeout(function () { event.detail.socketWrapper.reconnect(); }, delay);
        }
      });
      el.addEventListener("htmx:wsError", function () {
        badge("offline", "reconnecting");
        panel.startPolling();
      });
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setup);
  else setup();
})();
