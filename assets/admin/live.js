// queuegate's live view: follows GET /events (one update a second, the last
// 15 minutes first), draws each route's figures and chart, and sends the
// route controls with the admin token (kept in this tab at most).
"use strict";
(function () {
  var WINDOW_MS = 15 * 60 * 1000;
  var KEY = "queuegate-admin-token";
  var rings = {};
  var token = sessionStorage.getItem(KEY) || "";
  var $ = function (id) { return document.getElementById(id); };
  var SVG = "http://www.w3.org/2000/svg";

  function num(n) {
    return typeof n === "number" ? n.toLocaleString("en-US") : "–";
  }
  function secs(s) {
    if (typeof s !== "number") return "–";
    if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  function say(text, bad) {
    var r = $("result");
    r.textContent = text;
    r.setAttribute("data-kind", bad ? "bad" : "ok");
  }
  function showToken() {
    $("token-state").textContent = token
      ? "A token is set for this tab. Changes are logged with its name."
      : "Changing a route needs the admin token. It is kept in this tab only, never in the address.";
  }

  function section(name) {
    var id = "route-" + name;
    var el = document.getElementById(id);
    if (el) return el;
    el = $("route-tpl").content.firstElementChild.cloneNode(true);
    el.id = id;
    el.setAttribute("aria-labelledby", id + "-title");
    var h = el.querySelector(".route-name");
    h.id = id + "-title";
    h.textContent = name;
    el.querySelector(".plot").setAttribute("aria-label", "Line length, capacity and admissions on " + name + " over the last 15 minutes");
    var form = el.querySelector(".control");
    form.setAttribute("aria-label", "Controls of " + name);
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var body = {};
      var mode = form.elements.mode.value;
      var cap = form.elements.capacity.value.trim();
      if (mode) body.mode = mode;
      if (cap !== "") body.capacity = Number(cap);
      if (!mode && cap === "") { say("Choose a mode or a capacity first.", true); return; }
      send(name, "PUT", body);
    });
    el.querySelector(".clear").addEventListener("click", function () { send(name, "DELETE"); });
    $("routes").appendChild(el);
    return el;
  }

  function send(name, method, body) {
    if (!token) {
      say("Enter the admin token to change " + name + ".", true);
      $("token").focus();
      return;
    }
    var init = { method: method, headers: { "Authorization": "Bearer " + token }, cache: "no-store" };
    if (body) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    fetch("/routes/" + encodeURIComponent(name) + "/override", init).then(function (resp) {
      return resp.json().catch(function () { return {}; }).then(function (answer) {
        if (resp.status === 401) {
          say("Token refused: nothing was changed.", true);
          $("token").focus();
        } else if (!resp.ok) {
          say("Refused (" + (answer.field || resp.status) + "): " + (answer.error || "nothing was changed."), true);
        } else if (method === "DELETE") {
          say("Override of " + name + " cleared: the config file's values apply.");
        } else {
          say("Override of " + name + " set.");
        }
      });
    }).catch(function () {
      say("The admin listener did not answer: nothing known to be changed.", true);
    });
  }

  function fill(el, r) {
    var f = function (k) { return el.querySelector('[data-f="' + k + '"]'); };
    el.querySelector(".mode-name").textContent = "Mode: " + r.mode;
    var o = r.override;
    el.querySelector(".override-badge").hidden = !o;
    var note = el.querySelector(".override-note");
    note.hidden = !o;
    if (o) {
      var parts = [];
      if (o.mode) parts.push("mode " + o.mode.value + " (file: " + o.mode.file + ")");
      if (o.capacity) parts.push("capacity " + num(o.capacity.value) + " (file: " + num(o.capacity.file) + ")");
      note.textContent = "Override by " + o.by + ": " + parts.join(", ") + ".";
    }
    f("waiting").textContent = num(r.waiting);
    f("active").textContent = num(r.active) + " / " + num(r.capacity);
    var range = el.querySelector('[data-if="capacity_range"]');
    range.hidden = !r.capacity_range;
    if (r.capacity_range) f("capacity_range").textContent = num(r.capacity_range.min) + " – " + num(r.capacity_range.max);
    var origin = el.querySelector('[data-if="origin"]');
    origin.hidden = !r.origin;
    if (r.origin) f("origin").textContent = num(r.origin.p95_ms) + " ms / " + (r.origin.errors * 100).toFixed(1) + " %";
    f("admitted").textContent = typeof r.admitted_per_s === "number" ? r.admitted_per_s.toFixed(1) : "–";
    f("wait").textContent = r.wait ? secs(r.wait.p50_s) + " / " + secs(r.wait.p95_s) : "–";
    f("eta").textContent = r.eta_seconds === null || r.eta_seconds === undefined ? "–" : secs(r.eta_seconds);
    f("lanes").textContent = "Lanes: " + (r.lanes || []).map(function (l) {
      return l.name + " ×" + l.weight + " (" + num(l.waiting) + " waiting)";
    }).join(", ");
  }

  function draw(el, ring) {
    var svg = el.querySelector(".plot");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    // Drawn at the element's own size, so text is never stretched.
    var W = Math.max(200, Math.round(svg.clientWidth) || 600);
    var H = Math.max(120, Math.round(svg.clientHeight) || 180);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var top = 16, base = H - 18;
    var end = ring.length ? ring[ring.length - 1][0] : Date.now();
    var x = function (t) { return W - ((end - t) / WINDOW_MS) * W; };
    var ymax = 1, amax = 0;
    ring.forEach(function (p) { ymax = Math.max(ymax, p[1], p[2]); amax = Math.max(amax, p[3]); });
    ymax *= 1.1;
    var y = function (v) { return base - (v / ymax) * (base - top); };
    var mk = function (name, attrs) {
      var n = document.createElementNS(SVG, name);
      for (var k in attrs) n.setAttribute(k, attrs[k]);
      svg.appendChild(n);
      return n;
    };
    var peak = ymax / 1.1;
    mk("line", { "class": "grid", x1: 0, x2: W, y1: y(peak / 2), y2: y(peak / 2) });
    mk("line", { "class": "grid", x1: 0, x2: W, y1: y(peak), y2: y(peak) });
    var t = mk("text", { x: 4, y: y(peak) - 3 });
    t.textContent = num(Math.round(peak)) + " people";
    var label = mk("text", { x: 4, y: H - 4 });
    label.textContent = "−15 min";
    var now = mk("text", { x: W - 4, y: H - 4, "text-anchor": "end" });
    now.textContent = "now";
    if (amax > 0) {
      var bw = Math.max(1, W / 900);
      ring.forEach(function (p) {
        if (p[3] <= 0) return;
        var h = (p[3] / amax) * (base - top) * 0.35;
        mk("rect", { "class": "admitted", x: x(p[0]) - bw, y: base - h, width: bw, height: h });
      });
    }
    el.querySelector(".adm-max").textContent = amax > 0 ? "(peak " + amax.toFixed(1) + ")" : "";
    var line = function (i) {
      return ring.map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[i]).toFixed(1); }).join(" ");
    };
    mk("polyline", { "class": "capacity", points: line(2) });
    mk("polyline", { "class": "waiting", points: line(1) });
    svg.setAttribute("data-samples", ring.length);
  }

  function update(data) {
    var seen = {};
    (data.routes || []).forEach(function (r) {
      seen[r.name] = true;
      var ring = rings[r.name] || (rings[r.name] = []);
      if (r.sample) {
        ring.push(r.sample);
        var cut = r.sample[0] - WINDOW_MS;
        while (ring.length && ring[0][0] < cut) ring.shift();
      }
      var el = section(r.name);
      fill(el, r);
      draw(el, ring);
    });
    Array.prototype.slice.call(document.querySelectorAll(".route")).forEach(function (el) {
      if (!seen[el.id.slice(6)]) el.parentNode.removeChild(el);
    });
  }

  // Charts are drawn at their size: drawn again when it changes.
  window.addEventListener("resize", function () {
    Array.prototype.slice.call(document.querySelectorAll(".route")).forEach(function (el) {
      draw(el, rings[el.id.slice(6)] || []);
    });
  });

  function connect() {
    var conn = $("conn");
    var events = new EventSource("/events");
    events.addEventListener("history", function (e) {
      var h = JSON.parse(e.data);
      rings = {};
      for (var name in h.routes) rings[name] = h.routes[name];
    });
    events.onmessage = function (e) {
      conn.textContent = "Live";
      conn.setAttribute("data-state", "live");
      update(JSON.parse(e.data));
    };
    events.onerror = function () {
      conn.textContent = "Connection lost: reconnecting…";
      conn.setAttribute("data-state", "lost");
    };
  }

  $("token-form").addEventListener("submit", function (e) {
    e.preventDefault();
    var input = $("token");
    token = input.value.trim();
    input.value = "";
    if ($("keep").checked && token) sessionStorage.setItem(KEY, token);
    else sessionStorage.removeItem(KEY);
    showToken();
    say(token ? "Token set for this tab." : "No token entered.", !token);
  });
  $("forget").addEventListener("click", function () {
    token = "";
    sessionStorage.removeItem(KEY);
    showToken();
    say("Token forgotten.");
  });
  showToken();
  connect();
})();
