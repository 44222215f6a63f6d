// Healthplane web UI: live updates and confirmations. No framework: the pages are rendered
// on the server; this file only re-reads the live part of the page when the server says
// something it shows changed (server-sent events from /live), and asks before the commands
// the CLI asks about.
//
// The nodes table (UI-3) is not re-rendered: its rows stay where they are under the reader.
// Each row already shown is updated in place (its cells, never its place), and when a re-read
// would add, drop or move rows the page says "N changed — refresh" instead.
"use strict";
(function () {
  const live = document.getElementById("live");
  const table = document.getElementById("nodes");
  const rowsUrl = table && table.dataset.rows;

  const refreshFragment = async function () {
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (answer.ok) {
      live.innerHTML = await answer.text();
      live.dataset.updated = String(Date.now());
    } else if (answer.status === 401 || answer.redirected) {
      window.location.reload();
    }
  };

  const refreshRows = async function () {
    const shown = Array.from(table.querySelectorAll("tbody tr[data-key]"));
    const answer = await fetch(rowsUrl, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ shown: shown.map(function (tr) { return tr.dataset.key; }) }),
    });
    if (answer.status === 401) { window.location.reload(); return; }
    if (!answer.ok) { return; }
    const found = await answer.json();
    if (!found.readable) { await refreshFragment(); return; }  // "No health": the server's words
    const holder = document.createElement("tbody");
    shown.forEach(function (tr) {
      const html = found.rows[tr.dataset.key];
      if (html === undefined) { tr.classList.add("gone"); return; }  // left the fleet
      holder.innerHTML = html;
      const fresh = holder.querySelector("tr");
      tr.className = fresh.className;
      tr.querySelectorAll("td:not(.pick)").forEach(function (td) { td.remove(); });
      Array.from(fresh.children).forEach(function (td) { tr.appendChild(td); });
    });
    const total = document.getElementById("total");
    if (total) { total.textContent = String(found.total); }
    const changed = document.getElementById("changed");
    if (changed) {
      changed.hidden = found.changed === 0;
      changed.querySelector(".what").textContent = found.changed + " changed";
    }
    live.dataset.updated = String(Date.now());
  };

  if (live && live.dataset.live) {
    let busy = false;
    let again = false;
    const refresh = async function () {
      if (busy) { again = true; return; }
      busy = true;
      try {
        await (rowsUrl ? refreshRows() : refreshFragment());
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

  // The table's bulk selection: select-all on this page, and how many are selected.
  const all = document.getElementById("select-all");
  const count = document.getElementById("selected-count");
  if (table && all) {
    const boxes = function () { return table.querySelectorAll("tbody input[name=node]"); };
    // "Every node this filter matches": the server resolves the filter; the count says how many.
    const matching = document.getElementById("select-matching");
    const counted = function () {
      const picked = Array.from(boxes()).filter(function (box) { return box.checked; }).length;
      const total = document.getElementById("total");
      if (count) { count.textContent = matching && matching.checked && total ? total.textContent : String(picked); }
      all.checked = picked > 0 && picked === boxes().length;
    };
    all.addEventListener("change", function () {
      boxes().forEach(function (box) { box.checked = all.checked; });
      counted();
    });
    table.addEventListener("change", function (event) { if (event.target !== all) { counted(); } });
    if (matching) { matching.addEventListener("change", counted); }
  }

  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); }
    });
  });
})();
