// What vast-manager's operators had, on this product's pages:
// - keyboard shortcuts (r refresh, o offers, l log, b bad hosts, Esc closes dialogs), ignored
//   while typing in a field or with a modifier held; the nav links name them (aria-keyshortcuts);
// - the fleet table's SSH-command copy button, destroy and unmark confirm dialogs (rows arrive
//   by pushes, so clicks are delegated from the document);
// - the offers list's multi-select and the rent dialog: min rate = ceil($/h ÷ max $/proof),
//   $/day; the server computes the same and remembers the values per user.
(function () {
  "use strict";

  function typing(target) {
    if (!target || !target.closest) return false;
    return Boolean(target.isContentEditable ||
      target.closest("input, textarea, select, [contenteditable=''], [contenteditable='true']"));
  }

  function openDialog() { return document.querySelector("dialog[open]"); }

  function go(key) {
    var link = document.querySelector("[data-shortcut='" + key + "']");
    if (link) window.location.assign(link.href);
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      // Native dialogs close themselves on Esc when focus is inside; close the rest here.
      var dialog = openDialog();
      if (dialog) { dialog.close(); event.preventDefault(); }
      var help = document.querySelector("details.shortcuts[open]");
      if (help) help.open = false;
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target) || openDialog()) return;
    if (event.key === "r") { event.preventDefault(); window.location.reload(); }
    else if (event.key === "o" || event.key === "l" || event.key === "b") { event.preventDefault(); go(event.key); }
  });

  function notice(text) {
    var box = document.getElementById("toasts");
    if (!box) return;
    var el = document.createElement("div");
    el.className = "toast";
    el.setAttribute("role", "status");
    el.textContent = text;
    box.appendChild(el);
    setTimeout(function () { el.remove(); }, 6000);
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    // Plain-HTTP pages have no Clipboard API: the old selection route still works there.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = document.execCommand("copy");
    area.remove();
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function showDialog(id, fill) {
    var dialog = document.getElementById(id);
    if (!dialog) return;
    fill(dialog);
    dialog.showModal();
  }

  function actionFor(form, pk) {
    return form.getAttribute("data-action-template").replace("/0/", "/" + pk + "/");
  }

  document.addEventListener("click", function (event) {
    var target = event.target.closest ? event.target : event.target.parentElement;
    var button = target && target.closest("button, input[type=checkbox]");
    if (!button) return;
    if (button.matches(".copy-ssh")) {
      var command = button.getAttribute("data-copy");
      copy(command).then(function () { notice("Copied: " + command); },
                         function () { notice("Copy it by hand: " + command); });
    } else if (button.matches(".destroy-open")) {
      showDialog("destroy-dialog", function (dialog) {
        var form = dialog.querySelector("form");
        form.action = actionFor(form, button.getAttribute("data-machine"));
        dialog.querySelector(".machine-name").textContent = button.getAttribute("data-name");
      });
    } else if (button.matches(".unmark-open")) {
      showDialog("unmark-dialog", function (dialog) {
        var form = dialog.querySelector("form");
        form.action = actionFor(form, button.getAttribute("data-bad-host"));
        dialog.querySelector(".bad-label").textContent = button.getAttribute("data-label");
        dialog.querySelector(".bad-reason").textContent = button.getAttribute("data-reason");
      });
    } else if (button.matches("[data-close]")) {
      button.closest("dialog").close();
    } else if (button.matches(".rent-open")) {
      openRent([button.closest("tr")]);
    } else if (button.id === "rent-selected") {
      openRent(selectedRows());
    } else if (button.id === "select-all") {
      document.querySelectorAll(".select-offer").forEach(function (box) { box.checked = button.checked; });
      updateSelection();
    } else if (button.matches(".select-offer")) {
      updateSelection();
    }
  });

  // ---- offers: selection and the rent dialog

  function selectedRows() {
    return Array.prototype.map.call(document.querySelectorAll(".select-offer:checked"),
      function (box) { return box.closest("tr"); });
  }

  function updateSelection() {
    var count = selectedRows().length;
    var label = document.querySelector(".selected-count");
    if (label) label.textContent = count + " selected";
    var ignore = document.getElementById("ignore-selected");
    if (ignore) ignore.disabled = count === 0;
    var rent = document.getElementById("rent-selected");
    if (rent) rent.disabled = count === 0 || count > Number(rent.getAttribute("data-max"));
  }

  function minRate(dph, maxPerProof) {
    // The server computes it with decimals; the tolerance keeps an exact quotient exact here.
    return Math.max(1, Math.ceil(dph / maxPerProof - 1e-9));
  }

  function bidding(dialog) {
    var chosen = dialog.querySelector("[name=offer_type]:checked");
    var bid = Number(dialog.querySelector("[name=bid_price]").value);
    return chosen && chosen.value === "bid" && bid > 0 ? bid : null;
  }

  function renderRent(dialog) {
    var max = Number(dialog.querySelector("[name=max_price_per_proof]").value);
    var bid = bidding(dialog);
    dialog.querySelectorAll(".rent-summary tbody tr").forEach(function (row) {
      // At a bid, Vast bills the disk (dph_total - dph_base) plus the bid.
      var dph = Number(row.getAttribute("data-dph"));
      if (bid !== null) dph = dph - Number(row.getAttribute("data-dph-base")) + bid;
      row.querySelector(".dph").textContent = "$" + dph.toFixed(3);
      row.querySelector(".per-day").textContent = "$" + (dph * 24).toFixed(2);
      row.querySelector(".min-rate").textContent = max > 0 ? String(minRate(dph, max)) : "—";
    });
  }

  function openRent(rows) {
    rows = rows.filter(Boolean);
    if (!rows.length) return;
    showDialog("rent-dialog", function (dialog) {
      var form = dialog.querySelector("form");
      form.querySelectorAll("input[name=offer_ids]").forEach(function (el) { el.remove(); });
      var body = dialog.querySelector(".rent-summary tbody");
      body.textContent = "";
      var highestMinBid = 0;
      rows.forEach(function (row) {
        var hidden = document.createElement("input");
        hidden.type = "hidden";
        hidden.name = "offer_ids";
        hidden.value = row.getAttribute("data-offer-id");
        form.appendChild(hidden);
        var minBid = Number(row.getAttribute("data-min-bid"));
        highestMinBid = Math.max(highestMinBid, minBid || 0);
        var tr = document.createElement("tr");
        tr.setAttribute("data-dph", row.getAttribute("data-dph"));
        tr.setAttribute("data-dph-base", row.getAttribute("data-dph-base"));
        [row.getAttribute("data-offer-id"), row.getAttribute("data-gpus")]
          .forEach(function (text) {
            var td = document.createElement("td");
            td.textContent = text;
            tr.appendChild(td);
          });
        ["dph", "min-bid", "per-day", "min-rate"].forEach(function (name) {
          var td = document.createElement("td");
          td.className = name;
          tr.appendChild(td);
        });
        tr.querySelector(".min-bid").textContent = minBid ? "$" + minBid.toFixed(4) : "—";
        body.appendChild(tr);
      });
      // The bid starts at the highest minimum of the offers chosen: every one takes it.
      var bid = dialog.querySelector("[name=bid_price]");
      if (highestMinBid > 0) { bid.value = highestMinBid.toFixed(4); bid.min = highestMinBid.toFixed(4); }
      dialog.querySelector(".rent-count").textContent =
        rows.length + " offer" + (rows.length === 1 ? "" : "s");
      renderRent(dialog);
    });
  }

  document.addEventListener("input", function (event) {
    var dialog = event.target.closest && event.target.closest("#rent-dialog");
    if (dialog) renderRent(dialog);
  });
})();
