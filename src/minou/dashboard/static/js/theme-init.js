// Sets the theme before the first paint: the saved choice, else the system's
// (data-theme-auto marks the latter, so app.js follows later system changes).
// The stylesheet keys its dark palette on data-theme alone.
(function () {
  var root = document.documentElement, saved = null;
  try { saved = localStorage.getItem("minou.theme"); } catch (e) { /* storage disabled */ }
  if (saved === "light" || saved === "dark") {
    root.dataset.theme = saved;
  } else {
    root.dataset.theme = matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
    root.dataset.themeAuto = "1";
  }
})();
