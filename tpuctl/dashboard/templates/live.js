// A run's page while the run is live: its [data-live-src] part is fetched again every few seconds and
// swapped in, until the server answers that the run is no longer live (X-Tpuctl-Live: no).
(function () {
  "use strict";
  var part = document.querySelector("[data-live-src]");
  if (!part) { return; }
  var every = Number(part.getAttribute("data-live-every-ms")) || 2000;
  function tick() {
    fetch(part.getAttribute("data-live-src"), { cache: "no-store" }).then(function (answer) {
      var live = answer.headers.get("X-Tpuctl-Live") !== "no";
      return answer.text().then(function (html) {
        if (answer.ok) { part.innerHTML = html; }
        part.setAttribute("data-live", live ? "yes" : "no");
        if (live) { setTimeout(tick, every); }
      });
    }, function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
