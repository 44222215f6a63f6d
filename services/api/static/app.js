// Healthplane web UI: live updates and confirmations. No framework: the pages are rendered
// on the server; this file only re-reads the live part of the page when the server says
// something it shows changed (server-sent events from /live), and asks before the commands
// the CLI asks about.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (live && live.dataset.live) {
    let busy = false;
    let again = false;
    const refresh = async function () {
      if (busy) { again = true; return; }
      busy = true;
      try {
        const url = new URL(window.location.href);
        url.searchParams.set("fragment", "1");
        const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
        if (answer.ok) {
          live.innerHTML = await answer.text();
          live.dataset.updated = String(Date.now());
        } else if (answer.status === 401 || answer.redirected) {
          window.location.reload();
        }
      } catch (error) {
        // The server is away: the event stream reconnects by itself, and the next notice re-reads.
      } finally {
        busy = false;
        if (again) { again = false; refresh(); }
      }
    };
    const events = new EventSource(live.dataset.live);
    events.addEventListener("changed", refresh);
    // Whatever changed between the page's render and the stream's (re)connection was told
    // to no one: read once on every open.
    events.addEventListener("open", function () { document.body.dataset.live = "open"; refresh(); });
  }
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); }
    });
  });
})();
