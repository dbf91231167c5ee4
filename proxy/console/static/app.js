// The console's router: path-based pages under /console/, one shell (index.html).
import { whoami } from "./api.js";
import { clear, h, message } from "./dom.js";
import { overviewPage } from "./overview.js";
import { sessionsPage } from "./sessions.js";
import { sessionPage } from "./session.js";
import { healthPage } from "./health.js";
import { quotaPage } from "./quota.js";

const main = document.getElementById("main");
let generation = 0;

export function navigate(url) {
  history.pushState(null, "", url);
  route();
}

function highlight(name) {
  for (const a of document.querySelectorAll("nav a[data-nav]")) {
    if (a.dataset.nav === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

async function route() {
  const mine = ++generation;
  const path = location.pathname;
  const view = h("div", { class: "page" });
  let name = "";
  let run;
  if (path === "/console/" || path === "/console") {
    name = "overview";
    run = () => overviewPage(view, navigate);
  } else if (path === "/console/sessions" || path === "/console/sessions/") {
    name = "sessions";
    run = () => sessionsPage(view, navigate);
  } else if (path.startsWith("/console/sessions/")) {
    name = "sessions";
    const id = decodeURIComponent(path.slice("/console/sessions/".length));
    run = () => sessionPage(view, id);
  } else if (path === "/console/limits") {
    name = "limits";
    run = () => quotaPage(view);
  } else if (path === "/console/health") {
    name = "health";
    run = () => healthPage(view);
  } else {
    run = async () => {
      document.title = "Not found · context-proxy console";
      view.append(h("h1", {}, "Page not found"), message("error", "There is no such console page."));
    };
  }
  highlight(name);
  clear(main).append(view);
  main.setAttribute("aria-busy", "true");
  try {
    await run();
  } catch (err) {
    if (mine === generation && !(err && err.status === 401)) {
      view.append(message("error", "Could not load this page: " + (err && err.message ? err.message : String(err))));
    }
  } finally {
    if (mine === generation) main.setAttribute("aria-busy", "false");
  }
}

document.addEventListener("click", (event) => {
  if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
  const a = event.target.closest ? event.target.closest("a[href]") : null;
  if (!a || a.origin !== location.origin || !a.pathname.startsWith("/console/")) return;
  event.preventDefault();
  navigate(a.pathname + a.search);
});
window.addEventListener("popstate", route);

whoami().then(
  (me) => { document.getElementById("tenant").textContent = "Tenant: " + me.tenant; },
  () => {},
);
route();
