// Keeps the dashboard's health counts live: polls the status JSON and rewrites
// only the numbers, the reload and keys banners, the usage figures, the nodes' memory and the plan's age. Model names from the
// status are matched against data-model attributes and written with
// textContent, never as markup or CSS selectors, because they come from the
// catalogue.
(function () {
  "use strict";

  var body = document.body;
  var statusUrl = body.getAttribute("data-status-url");
  var pollMs = Number(body.getAttribute("data-poll-ms")) || 5000;
  var digest = body.getAttribute("data-digest");
  var live = document.getElementById("live");
  var liveText = live ? live.textContent : "";
  var timer = null;

  // `stopped`: on-demand replicas whose engine is stopped, neither healthy nor down ("idle").
  function setCount(el, healthy, placed, stopped) {
    if (!el) return;
    var h = el.querySelector(".healthy");
    var p = el.querySelector(".placed");
    if (h) h.textContent = String(healthy);
    if (p) p.textContent = String(placed);
    var note = el.parentNode ? el.parentNode.querySelector(".stopped") : null;
    if (note && stopped !== undefined) note.textContent = String(stopped);
    el.classList.remove("ok", "some", "none", "idle");
    el.classList.add(
      placed && healthy === placed ? "ok"
        : stopped && healthy + stopped === placed ? "idle"
        : healthy === 0 ? "none" : "some");
    var title = el.getAttribute("title") || "";
    el.setAttribute("title", title.replace(/^\d+ of \d+/, healthy + " of " + placed));
  }

  function applyModel(group, m) {
    setCount(group.querySelector(".health .count"), m.healthy, m.placed, m.stopped);
    var sync = group.querySelector(".fleet .sync"), fleetHealth = group.querySelector(".fleet .fleet-health");
    if (sync) sync.textContent = m.sync || "";
    if (fleetHealth) fleetHealth.textContent = m.fleet_health || "";
    var profiles = group.querySelectorAll("[data-profile]");
    for (var i = 0; i < profiles.length; i++) {
      var p = m.profiles[profiles[i].getAttribute("data-profile")];
      if (!p) continue;
      setCount(profiles[i].querySelector(".count"), p.healthy, p.placed);
      var hits = profiles[i].querySelector(".hits"), spills = profiles[i].querySelector(".spills");
      if (hits && p.prefix_hits !== undefined) hits.textContent = String(p.prefix_hits);
      if (spills && p.prefix_spills !== undefined) spills.textContent = String(p.prefix_spills);
    }
  }

  function applyUsage(usage) {
    var win = document.getElementById("usage-window");
    if (win && usage.window) win.textContent = usage.window;
    var rows = document.querySelectorAll("tr[data-usage-model]");
    var cells = { rpm: "rpm", latency: "latency", ttft: "ttft", tokens: "tokens_per_second", waiting: "waiting" };
    for (var i = 0; i < rows.length; i++) {
      var u = usage.models[rows[i].getAttribute("data-usage-model")];
      if (!u) continue;
      for (var cls in cells) {
        var cell = rows[i].querySelector("." + cls);
        if (cell) cell.textContent = String(u[cells[cls]]);
      }
    }
  }

  // Node names and model names come from the plan: matched against data attributes,
  // never used as selectors.
  function applyNodes(nodes) {
    var els = document.querySelectorAll("div[data-node]");
    for (var i = 0; i < els.length; i++) {
      var n = nodes[els[i].getAttribute("data-node")];
      if (!n) continue;
      var x = 0;
      ["always", "loaded", "free"].forEach(function (part) {
        var rect = els[i].querySelector("rect." + part);
        if (!rect) return;
        rect.setAttribute("x", String(x));
        rect.setAttribute("width", String(n.bar[part]));
        x += n.bar[part];
      });
      var label = els[i].querySelector(".memory-label");
      if (label) label.textContent = n.label;
      var svg = els[i].querySelector("svg.bar");
      if (svg) svg.setAttribute("aria-label", n.label);
      var items = els[i].querySelectorAll("li[data-on-demand]");
      for (var j = 0; j < items.length; j++) {
        var loaded = n.loaded[items[j].getAttribute("data-on-demand")] === true;
        var start = items[j].querySelector(".start");
        if (!start) continue;
        start.textContent = loaded ? "loaded" : "starts on first use";
        start.classList.toggle("loaded", loaded);
        start.classList.toggle("idle", !loaded);
      }
    }
  }

  function apply(status) {
    var groups = document.querySelectorAll("tbody[data-model]");
    for (var i = 0; i < groups.length; i++) {
      var m = status.models[groups[i].getAttribute("data-model")];
      if (m) applyModel(groups[i], m);
    }
    var age = document.getElementById("age");
    if (age) age.textContent = "(" + status.age + ")";
    var banner = document.getElementById("refusal");
    if (banner) {
      document.getElementById("refusal-reason").textContent = status.refusal || "";
      banner.hidden = !status.refusal;
      var errors = status.discovery_errors || [];
      document.getElementById("discovery-reason").textContent = errors.join(" ");
      document.getElementById("discovery").hidden = errors.length === 0;
    }
    var keysBanner = document.getElementById("keys-refusal");
    if (keysBanner) {
      document.getElementById("keys-refusal-reason").textContent = status.keys_refusal || "";
      keysBanner.hidden = !status.keys_refusal;
    }
    var limitsBanner = document.getElementById("limits-degraded");
    if (limitsBanner) {
      document.getElementById("limits-degraded-reason").textContent = status.limits_degraded || "";
      limitsBanner.hidden = !status.limits_degraded;
    }
    if (status.usage) applyUsage(status.usage);
    if (status.nodes) applyNodes(status.nodes);
    var changed = document.getElementById("plan-changed");
    if (changed) changed.hidden = status.digest === digest;
  }

  function setLive(text, stale) {
    if (!live) return;
    live.textContent = text;
    live.classList.toggle("stale", stale);
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(poll, pollMs);
  }

  function poll() {
    if (document.hidden) return; // resumed by visibilitychange
    fetch(statusUrl, { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (resp) {
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        return resp.json();
      })
      .then(function (status) {
        apply(status);
        setLive(liveText, false);
      })
      .catch(function () {
        setLive("the gateway is not answering; these counts may be stale", true);
      })
      .then(schedule);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) poll();
  });
  schedule();
})();
