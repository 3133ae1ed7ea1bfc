// Proof actions (cancel, retry) are part of a proof's panel, which is pushed to every viewer of
// that proof, so they arrive hidden; this shows them to whoever may use them: staff, or the
// user who started the proof. The server checks again on every post (403 otherwise).
(function () {
  "use strict";

  function reveal(root) {
    var viewer = document.body.dataset;
    root.querySelectorAll(".proof-actions[data-owner]").forEach(function (el) {
      el.hidden = !(viewer.staff === "1" || (el.dataset.owner !== "" && el.dataset.owner === viewer.user));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    reveal(document);
    // Any swap (websocket push, polling fallback, htmx post) brings fresh, hidden actions.
    new MutationObserver(function () { reveal(document); })
      .observe(document.body, { childList: true, subtree: true });
  });
})();
