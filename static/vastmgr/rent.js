// The rent dialog's engine choice: the image, env and onstart fields matter only for an
// upstream cuzk worker, so they show only while it is chosen (the server ignores them else).
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var radio = event.target;
    if (!radio.matches || !radio.matches("#rent-dialog input[name=engine_flavour]")) return;
    var fields = radio.closest("form").querySelector(".upstream-fields");
    if (fields) fields.hidden = radio.value !== "cuzk-upstream";
  });
})();
