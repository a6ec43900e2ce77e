// The console's only script: live regions and confirmations. Pages work without it (a reload
// shows what is new; actions go through unconfirmed).
"use strict";

const LIVE_EVERY_MS = 2000;

// Every element marked data-live (with an id) is refreshed from the same page every two seconds
// while the tab is visible: new runs appear, states and progress move, without a reload.
async function refreshLive() {
  const live = document.querySelectorAll("[data-live][id]");
  if (live.length === 0 || document.hidden) return;
  try {
    const answer = await fetch(window.location.href, {credentials: "same-origin", headers: {"X-Console-Live": "1"}});
    if (!answer.ok || answer.redirected) return;
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    for (const element of live) {
      const fresh = page.getElementById(element.id);
      if (fresh !== null && fresh.innerHTML !== element.innerHTML) element.innerHTML = fresh.innerHTML;
    }
  } catch (error) {
    // The node is restarting or out of reach: try again on the next tick.
  }
}

document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form !== null && !window.confirm(form.dataset.confirm)) event.preventDefault();
});

window.setInterval(refreshLive, LIVE_EVERY_MS);
