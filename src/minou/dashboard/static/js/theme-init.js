// Applies the saved theme before the first paint. Without a saved choice the
// page follows prefers-color-scheme (no data-theme attribute).
(function () {
  try {
    var t = localStorage.getItem("minou.theme");
    if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
  } catch (e) { /* storage disabled: follow the system */ }
})();
