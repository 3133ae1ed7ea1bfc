// A fleet row's inline detail (vast-manager's expanded row): the row's toggle fetches it with
// htmx and inserts it under the row; pressed again, it goes. Rows are replaced by pushes and
// the whole body by a full state, so which rows are open is kept here and put back after
// every change of the table: the toggle says "expanded" again, a detail the controller's
// pushed table body would replace is kept and put back, one that some other swap took away is
// fetched again, one that was left behind a re-ordered row follows it.
(function () {
  "use strict";
  var open = {};     // machine id → true while its detail is wanted
  var loading = {};  // machine id → true while its detail is being fetched

  function row(id) { return document.getElementById("host-" + id + "-row"); }
  function detail(id) { return document.getElementById("host-" + id + "-detail"); }

  // Fetched details land here first: the row they belong under may be replaced by a push
  // while the request is out, so they are put in place (by sync) when they arrive.
  function holder() {
    var body = document.getElementById("fleet-detail-holder");
    if (body) return body;
    var table = document.createElement("table");
    table.hidden = true;
    body = document.createElement("tbody");
    body.id = "fleet-detail-holder";
    table.appendChild(body);
    document.body.appendChild(table);
    return body;
  }

  // The toggle is the request's source: htmx runs one request per source element at a time,
  // and answers a second one from the same source (the page's body, when none is named) at
  // once, with nothing swapped. A detail that did not come (an error, a refused request) is
  // not asked for again in a loop: the row shows as closed, and a person may press again.
  function fetchDetail(id) {
    var tr = row(id);
    var toggle = tr && tr.querySelector(".row-toggle");
    if (!toggle || loading[id] || !window.htmx) return;
    loading[id] = true;
    holder();
    function arrived() {
      delete loading[id];
      if (!detail(id)) delete open[id];
      sync();
    }
    window.htmx.ajax("GET", toggle.getAttribute("data-detail-url"),
                     { source: toggle, target: "#fleet-detail-holder", swap: "beforeend" })
      .then(arrived, arrived);
  }

  function collapse(id) {
    delete open[id];
    var gone = detail(id);
    if (gone) {
      if (window.htmx) {
        // An unfinished log read is abandoned; removing closes the panel's socket and ends
        // the logs' polling.
        gone.querySelectorAll(".detail-logs").forEach(function (logs) {
          window.htmx.trigger(logs, "htmx:abort");
        });
        window.htmx.remove(gone);
      } else gone.remove();
    }
    sync();
  }

  function sync() {
    document.querySelectorAll(".row-toggle").forEach(function (toggle) {
      var id = toggle.closest("tr").getAttribute("data-host");
      var expanded = Boolean(open[id]);
      if (toggle.getAttribute("aria-expanded") !== String(expanded)) {
        toggle.setAttribute("aria-expanded", String(expanded));
      }
    });
    Object.keys(open).forEach(function (id) {
      var tr = row(id), shown = detail(id);
      if (!tr) {  // filtered out or destroyed: nothing to show it under
        delete open[id];
        if (shown) window.htmx.remove(shown);
        return;
      }
      if (!shown) fetchDetail(id);
      else if (tr.nextElementSibling !== shown) tr.after(shown);
    });
    // One that arrived after its row was closed again is not wanted.
    var waiting = document.getElementById("fleet-detail-holder");
    if (waiting) {
      Array.prototype.forEach.call(waiting.children, function (late) {
        if (!open[late.getAttribute("data-detail-for")]) window.htmx.remove(late);
      });
    }
  }

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest && event.target.closest(".row-toggle");
    if (!toggle) return;
    var id = toggle.closest("tr").getAttribute("data-host");
    if (open[id]) { collapse(id); return; }
    open[id] = true;
    sync();
  });

  // A pushed table body (a page whose rows changed: a host added, gone or moved) would take
  // the open details with it, their sockets and the place a reader had in their logs. They
  // step aside into the holder first; sync puts them back under their rows.
  function keepDetails(event) {
    var target = event.detail && event.detail.target;
    if (!target || !target.querySelectorAll) return;
    var kept = target.querySelectorAll(".row-detail");
    if (!kept.length) return;
    var body = holder();
    Array.prototype.forEach.call(kept, function (detailRow) { body.appendChild(detailRow); });
  }

  function watch() {
    var table = document.getElementById("fleet-table");
    if (!table) return;
    document.addEventListener("htmx:oobBeforeSwap", keepDetails);
    new MutationObserver(sync).observe(table, { childList: true, subtree: true });
  }

  // The detail's socket is the host page's: besides the panel and charts the detail shows, it
  // carries the notices (toasts) that the fleet's own socket delivers to this page already.
  // Only the parts the detail holds are swapped in: no notice twice, no part without a target.
  if (window.htmx) {
    window.htmx.defineExtension("detail-socket", {
      transformResponse: function (text, xhr, socketElt) {
        if (xhr) return text;  // an ordinary request (a chart window) asked for what it gets
        var template = document.createElement("template");
        template.innerHTML = text;
        Array.prototype.slice.call(template.content.children).forEach(function (part) {
          if (!part.id || !socketElt.querySelector("#" + CSS.escape(part.id))) part.remove();
        });
        return template.innerHTML;
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
  else watch();
})();
