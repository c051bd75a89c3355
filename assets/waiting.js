(function () {
  "use strict";
  var byId = function (id) { return document.getElementById(id); };
  var initial, strings;
  try {
    initial = JSON.parse(byId("qg-state").textContent);
    strings = JSON.parse(byId("qg-strings").textContent);
  } catch (e) {
    return; // The server-rendered page and its meta refresh still work.
  }
  var view = initial;
  var lang = strings[view.lang] ? view.lang : "en";
  var failures = 0;
  var timer = null;
  var nextAt = 0;
  var lastAnnounce = "";
  var lastAnnounceAt = 0;
  var noticeKey = "";
  var store = (function () {
    try { var s = window.sessionStorage; s.setItem("qg-probe", "1"); s.removeItem("qg-probe"); return s; }
    catch (e) { return null; }
  })();
  // Before the opening: when it comes by this browser's clock, from the
  // server's time left (so a wrong clock here does not matter).
  var opensAt = typeof view.opens_in_ms === "number" ? Date.now() + view.opens_in_ms : 0;
  var startKey = "qg-start:" + view.route;
  var unknownKey = "qg-unknown:" + view.route;

  function el(name) { return document.querySelector('[data-qg="' + name + '"]'); }
  function t(key, params) {
    var s = (strings[lang] && strings[lang][key]) || (strings.en && strings.en[key]) || "";
    if (params) {
      s = s.replace(/\{(\w+)\}/g, function (m, k) { return params[k] != null ? String(params[k]) : m; });
    }
    return s;
  }
  function setText(name, text) { var e = el(name); if (e && e.textContent !== text) { e.textContent = text; } }
  function num(n) {
    if (typeof n !== "number" || !isFinite(n)) { return "–"; }
    try { return n.toLocaleString(lang === "ko" ? "ko-KR" : "en-US"); } catch (e) { return String(n); }
  }
  function eta(seconds) {
    if (typeof seconds !== "number" || !isFinite(seconds) || seconds < 0) { return t("eta_calculating"); }
    if (seconds < 60) { return t("eta_under_minute"); }
    var m = Math.floor((seconds + 30) / 60);
    if (m <= 1) { return t("eta_minute"); }
    if (m < 10) { return t("eta_minutes", { n: m }); }
    var m5 = Math.floor((m + 2) / 5) * 5;
    if (m5 < 60) { return t("eta_minutes", { n: m5 }); }
    var h = Math.floor((seconds + 1800) / 3600);
    return h <= 1 ? t("eta_hour") : t("eta_hours", { n: h });
  }
  // Only a path on this site is followed, whatever an answer says.
  function safePath(p) {
    return typeof p === "string" && p.charAt(0) === "/" && p.charAt(1) !== "/" &&
      p.indexOf("\\") < 0 && !/[\u0000-\u0020\u007f]/.test(p) ? p : null;
  }
  var returnPath = safePath(view["return"]) || "/";

  function startPosition(position) {
    var start = typeof view.start_position === "number" ? view.start_position : 0;
    if (store) { start = Math.max(start, parseInt(store.getItem(startKey), 10) || 0); }
    if (typeof position === "number") { start = Math.max(start, position); }
    if (store && start > 0) { store.setItem(startKey, String(start)); }
    view.start_position = start;
    return start;
  }
  function rememberInUrl(params) {
    try {
      var u = new URL(location.href);
      Object.keys(params).forEach(function (k) { u.searchParams.set(k, params[k]); });
      if (u.href !== location.href) { history.replaceState(history.state, "", u.href); }
    } catch (e) { /* old browser: the server-rendered links still carry the language */ }
  }

  function render() {
    var state = view.state;
    document.body.setAttribute("data-state", state);
    document.documentElement.lang = lang;
    Array.prototype.forEach.call(document.querySelectorAll("[data-i18n]"), function (e) {
      var s = t(e.getAttribute("data-i18n"));
      if (s && e.textContent !== s) { e.textContent = s; }
    });
    var heading = t("heading_" + state);
    setText("headline", heading);
    setText("lead", t("lead_" + state));
    if (!view.has_title) { setText("title", t("default_title")); }
    document.title = heading + " · " + (el("title") ? el("title").textContent : "");
    var other = lang === "ko" ? "en" : "ko";
    var sw = el("lang-switch");
    if (sw) {
      sw.textContent = strings[other].lang_name;
      sw.setAttribute("lang", other);
      sw.setAttribute("hreflang", other);
      sw.setAttribute("aria-label", t("lang_switch_label"));
    }
    if (state === "waiting") {
      var start = startPosition(view.position);
      setText("position", num(view.position));
      setText("ahead", num(view.ahead));
      setText("total", num(view.waiting_total));
      setText("eta", eta(view.eta_seconds));
      var bar = el("progress");
      if (bar && typeof view.position === "number" && start > 0) {
        var pct = Math.max(0, Math.min(100, Math.floor((start - view.position) * 100 / start)));
        bar.value = pct;
        bar.textContent = pct + "%";
      }
    }
    if (state === "prequeue") { showCountdown(); }
    var lane = el("lane");
    if (lane) { lane.hidden = !(state === "waiting" && view.priority); }
    var cont = el("continue");
    if (cont) { cont.setAttribute("href", returnPath); }
    notice(noticeKey);
  }
  function showCountdown() {
    var s = Math.max(0, Math.ceil((opensAt - Date.now()) / 1000));
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    setText("opens-in", Math.floor(s / 3600) + ":" + two(Math.floor(s / 60) % 60) + ":" + two(s % 60));
    var at = el("opens-at");
    if (at && view.opens_at) {
      var d = new Date(view.opens_at);
      if (!isNaN(d.getTime())) {
        try {
          at.textContent = d.toLocaleString(lang === "ko" ? "ko-KR" : "en-US",
            { dateStyle: "medium", timeStyle: "short" });
        } catch (err) { /* keep the server's text */ }
      }
    }
  }
  function showUpdated(date) {
    var e = el("updated");
    if (!e) { return; }
    e.setAttribute("datetime", date.toISOString());
    try {
      e.textContent = date.toLocaleTimeString(lang === "ko" ? "ko-KR" : "en-US",
        { hour: "numeric", minute: "2-digit", second: "2-digit" });
    } catch (err) { e.textContent = date.toTimeString().slice(0, 8); }
  }
  function notice(key) {
    noticeKey = key;
    var e = el("notice");
    if (!e) { return; }
    var text = key ? t(key) : "";
    if (e.textContent !== text) { e.textContent = text; }
    e.hidden = !text;
  }
  function announce(force) {
    if (view.state !== "waiting") { return; }
    var text = t("announce_waiting", { position: num(view.position), eta: eta(view.eta_seconds) });
    var now = Date.now();
    if (text === lastAnnounce || (!force && now - lastAnnounceAt < 30000)) { return; }
    lastAnnounce = text;
    lastAnnounceAt = now;
    setText("live", text);
  }

  // Browsers throttle a hidden tab's timers (Chrome: to once a minute after
  // five minutes), longer than a silent waiter keeps its place. A dedicated
  // worker's timers are not throttled that way, so the worker keeps time and
  // the page polls when it says so. The page's own timer stays as a backstop
  // (a little later) in case the worker cannot start; whichever fires first
  // runs the step, once.
  var ticker = (function () {
    try {
      if (typeof Worker !== "function" || typeof Blob !== "function" || !window.URL) { return null; }
      var code = "var t=null;onmessage=function(e){clearTimeout(t);var d=e.data;" +
        "if(d&&d.ms>=0){t=setTimeout(function(){postMessage(d.id);},d.ms);}};";
      var w = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })));
      w.onmessage = function (e) { fire(e.data); };
      w.onerror = function () { ticker = null; };
      return w;
    } catch (e) { return null; }
  })();
  var step = null;
  var stepId = 0;
  function fire(id) {
    if (id !== stepId || !step) { return; }
    var fn = step;
    step = null;
    clearTimeout(timer);
    fn();
  }
  function schedule(ms, fn) {
    clearTimeout(timer);
    stepId += 1;
    step = fn || poll;
    nextAt = Date.now() + ms;
    var id = stepId;
    if (ticker) {
      try { ticker.postMessage({ id: id, ms: ms }); } catch (e) { ticker = null; }
    }
    timer = setTimeout(function () { fire(id); }, ticker ? ms + 1000 : ms);
  }
  function jitter(ms) { return Math.round(ms * (0.8 + Math.random() * 0.4)); }
  function backoff() {
    failures += 1;
    return jitter(Math.min(30000, 1000 * Math.pow(2, Math.min(failures - 1, 5))));
  }
  function onFailure() {
    notice("reconnecting");
    schedule(backoff());
  }
  function go(path) {
    closeStream();
    view.state = "admitted";
    render();
    setText("live", t("heading_admitted"));
    location.replace(path);
  }
  function onUnknown() {
    // The server no longer knows this ticket: reload so it can put the
    // visitor back in line. A browser that drops cookies would loop here,
    // so repeated answers slow down and say why.
    var count = 0;
    if (store) {
      count = (parseInt(store.getItem(unknownKey), 10) || 0) + 1;
      store.setItem(unknownKey, String(count));
    }
    if (count >= 3) {
      notice("cookies_note");
      failures = count - 1;
      schedule(backoff(), function () { location.reload(); });
      return;
    }
    view.state = "unknown";
    render();
    location.reload();
  }
  function onStatus(s) {
    if (!s || typeof s !== "object") { onFailure(); return; }
    if (s.state === "admitted") {
      failures = 0;
      go(safePath(s["return"]) || returnPath);
      return;
    }
    if (s.state === "unknown") { failures = 0; onUnknown(); return; }
    if (s.state === "prequeue" && typeof s.opens_in_ms === "number") {
      failures = 0;
      notice("");
      view.state = "prequeue";
      view.opens_at = s.opens_at;
      opensAt = Date.now() + s.opens_in_ms;
      render();
      showUpdated(new Date());
      var until = typeof s.poll_after_ms === "number" && s.poll_after_ms > 0 ? s.poll_after_ms : 5000;
      schedule(Math.max(100, Math.min(60000, until)));
      return;
    }
    if (s.state !== "waiting") { onFailure(); return; }
    showPlace(s);
    // While the event stream is live, it says when the place moves.
    if (streaming) { return; }
    var wait = typeof s.poll_after_ms === "number" && s.poll_after_ms > 0 ? s.poll_after_ms : 5000;
    schedule(Math.max(500, Math.min(60000, wait)));
  }
  function showPlace(s) {
    failures = 0;
    if (store) { store.removeItem(unknownKey); }
    notice("");
    view.state = "waiting";
    ["position", "ahead", "waiting_total", "eta_seconds", "poll_after_ms"].forEach(function (k) {
      view[k] = typeof s[k] === "number" ? s[k] : null;
    });
    view.priority = s.priority === true;
    render();
    showUpdated(new Date());
    announce(false);
    if (view.start_position > 0) { rememberInUrl({ start: view.start_position }); }
  }
  var inFlight = false;
  function poll() {
    clearTimeout(timer);
    step = null;
    nextAt = 0;
    if (inFlight) { return; }
    inFlight = true;
    var ctrl = typeof AbortController === "function" ? new AbortController() : null;
    var guard = setTimeout(function () { if (ctrl) { ctrl.abort(); } }, 15000);
    fetch(view.status_url, {
      credentials: "same-origin", cache: "no-store",
      headers: { "Accept": "application/json" }, signal: ctrl ? ctrl.signal : undefined
    }).then(function (r) {
      if (r.status !== 200) { throw new Error("status " + r.status); }
      return r.json();
    }).then(function (s) {
      clearTimeout(guard);
      inFlight = false;
      onStatus(s);
    }, function () {
      clearTimeout(guard);
      inFlight = false;
      onFailure();
    });
  }

  // Pushed updates: where the browser has EventSource, the page follows its
  // place on the server's event stream, which is also its heartbeat, and
  // polls only when the stream cannot be had. Each event is the status
  // answer; one that is not "waiting" ends the stream, and the page then
  // makes one status request (it sets the pass when admitted, which a
  // stream cannot). A stream that fails, or sends nothing within a few
  // seconds, leaves the page polling as before, and is tried again later
  // with backoff.
  var eventsUrl = typeof view.status_url === "string" ? view.status_url.replace("/status?", "/events?") : "";
  var source = null;
  var streaming = false;
  var streamFailures = 0;
  var streamRetry = null;
  var streamQuiet = null;
  function stopPolling() {
    clearTimeout(timer);
    stepId += 1;
    step = null;
    nextAt = 0;
  }
  function closeStream() {
    clearTimeout(streamQuiet);
    streaming = false;
    if (source) {
      source.onmessage = null;
      source.onerror = null;
      try { source.close(); } catch (e) { /* already closed */ }
      source = null;
    }
  }
  function retryStream() {
    streamFailures += 1;
    clearTimeout(streamRetry);
    streamRetry = setTimeout(openStream,
      jitter(Math.min(300000, 5000 * Math.pow(2, Math.min(streamFailures - 1, 6)))));
  }
  function streamFailed() {
    var was = streaming;
    closeStream();
    if (view.state !== "waiting") { return; }
    retryStream();
    // Polling takes over: at once if the stream was the only thing keeping
    // the place fresh, else when the running poll timer says.
    if (was || step === null) { poll(); }
  }
  function quietFor(ms) {
    clearTimeout(streamQuiet);
    streamQuiet = setTimeout(streamFailed, ms);
  }
  function openStream() {
    clearTimeout(streamRetry);
    if (source || view.state !== "waiting" || typeof EventSource !== "function" || eventsUrl.indexOf("/events?") < 0) { return; }
    try { source = new EventSource(eventsUrl); } catch (e) { source = null; retryStream(); return; }
    source.onmessage = function (ev) {
      var s;
      try { s = JSON.parse(ev.data); } catch (e) { return; }
      if (!s || typeof s !== "object") { return; }
      // A live stream sends at least every 15 seconds.
      quietFor(45000);
      if (s.state === "waiting") {
        streaming = true;
        streamFailures = 0;
        stopPolling();
        showPlace(s);
        return;
      }
      closeStream();
      if (s.state !== "admitted") { retryStream(); }
      poll();
    };
    source.onerror = streamFailed;
    quietFor(5000);
  }

  var sw = el("lang-switch");
  if (sw) {
    sw.addEventListener("click", function (ev) {
      ev.preventDefault();
      lang = lang === "ko" ? "en" : "ko";
      render();
      var shown = el("updated");
      if (shown && shown.getAttribute("datetime")) {
        var d = new Date(shown.getAttribute("datetime"));
        if (!isNaN(d.getTime())) { showUpdated(d); }
      }
      rememberInUrl({ lang: lang });
      announce(true);
    });
  }

  render();
  var polling = function () { return view.state === "waiting" || view.state === "prequeue"; };
  if (polling()) {
    if (typeof fetch !== "function") {
      schedule(jitter(Math.max(2000, view.poll_after_ms || 5000)), function () { location.reload(); });
      return;
    }
    showUpdated(new Date((view.updated_unix_s || 0) * 1000 || Date.now()));
    if (view.start_position > 0) { rememberInUrl({ start: view.start_position }); }
    schedule(Math.max(500, Math.min(60000, view.poll_after_ms || 5000)));
    // Come back at once from a background tab, a sleeping laptop or a lost
    // connection.
    var pollNow = function () { if (polling() && step === poll) { poll(); } };
    setInterval(function () { if (view.state === "prequeue") { showCountdown(); } }, 1000);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) { pollNow(); } });
    window.addEventListener("online", pollNow);
    // A stream over a lost network may say nothing for a long while: the
    // browser knows sooner.
    window.addEventListener("offline", function () { if (source) { streamFailed(); } });
    openStream();
  } else if (view.retry_after_s > 0) {
    var retry = el("retry");
    var target = retry ? retry.getAttribute("href") : returnPath;
    schedule(jitter(view.retry_after_s * 1000), function () { location.replace(target); });
  }
})();
