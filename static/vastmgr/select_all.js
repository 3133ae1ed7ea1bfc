// A "select all" checkbox (data-select-all="NAME") checks or clears every checkbox named NAME
// in its form, and shows mixed when only some are checked.
(function () {
  function boxes(all) {
    return [...all.form.querySelectorAll(`input[type=checkbox][name="${all.dataset.selectAll}"]`)];
  }
  function sync(all) {
    const checked = boxes(all).filter(b => b.checked).length;
    all.checked = checked > 0 && checked === boxes(all).length;
    all.indeterminate = checked > 0 && !all.checked;
  }
  document.addEventListener("change", event => {
    const target = event.target;
    if (target.matches("input[data-select-all]")) {
      boxes(target).forEach(b => { b.checked = target.checked; });
    } else if (target.matches("input[type=checkbox]") && target.form) {
      target.form.querySelectorAll("input[data-select-all]").forEach(sync);
    }
  });
  document.addEventListener("DOMContentLoaded",
    () => document.querySelectorAll("input[data-select-all]").forEach(sync));
})();
