// The rent dialog's choices: the image, env and onstart fields matter only for an upstream
// cuzk worker, and the bid only for an interruptible rental, so each shows only while chosen
// (the server ignores them else).
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var radio = event.target;
    if (!radio.matches) return;
    var form = radio.closest("form");
    if (radio.matches("#rent-dialog input[name=engine_flavour]")) {
      var fields = form.querySelector(".upstream-fields");
      if (fields) fields.hidden = radio.value !== "cuzk-upstream";
    } else if (radio.matches("#rent-dialog input[name=offer_type]")) {
      var bid = form.querySelector(".bid-field");
      if (bid) bid.hidden = radio.value !== "bid";
      form.querySelector("[name=bid_price]").required = radio.value === "bid";
    }
  });
})();
