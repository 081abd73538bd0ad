// Live updates: a <main data-live="ms"> is fetched again every ms and
// replaced, when it changed, while the tab is visible and no form field
// has the focus.
(function () {
  const main = document.getElementById("main");
  if (!main || !main.dataset.live) return;
  const every = parseInt(main.dataset.live, 10) || 2000;
  async function refresh() {
    if (document.hidden || (document.activeElement && document.activeElement.closest("form"))) return;
    try {
      const r = await fetch(location.href, { credentials: "same-origin", headers: { "X-Norn-Live": "1" } });
      if (!r.ok || r.redirected) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("main");
      if (fresh && fresh.innerHTML !== main.innerHTML) main.innerHTML = fresh.innerHTML;
    } catch (e) { /* the node is away: try again next time */ }
  }
  setInterval(refresh, every);
})();
