// dlock console: the only script. It is served from /assets (the CSP allows no inline
// script), attaches its own handlers, and reads data only from escaped data-* attributes.
(function () {
  "use strict";

  // A form with data-confirm asks first (the revoke form).
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      ev.preventDefault();
    }
  });

  var main = document.getElementById("main");
  var status = document.getElementById("live-status");
  var liveUrl = main && main.getAttribute("data-live");
  if (!liveUrl || !window.EventSource || !window.fetch) {
    return;
  }

  function setStatus(text) {
    if (status) {
      status.textContent = text;
    }
  }

  var inflight = false;
  var again = false;
  var waiting = false;

  // Whether the user is typing in a form of the main region: then a swap would lose input.
  function busy() {
    var a = document.activeElement;
    return !!(a && a !== main && main.contains(a) && a.form);
  }

  // Re-fetches this page's main region and swaps it in.
  function refresh(then) {
    if (inflight) {
      again = true;
      return;
    }
    if (busy()) {
      waiting = true;
      setStatus("Live: updates waiting (finish the form, or reload)");
      if (then) { then(); }
      return;
    }
    inflight = true;
    fetch(window.location.href, {
      headers: { "X-Console-Fragment": "1" },
      credentials: "same-origin",
      cache: "no-store",
      redirect: "follow"
    }).then(function (r) {
      if (r.redirected || r.status === 401 || r.status === 303) {
        window.location.reload();
        return null;
      }
      return r.status === 200 ? r.text() : null;
    }).then(function (html) {
      if (typeof html === "string") {
        main.innerHTML = html;
        waiting = false;
        setStatus("Live");
      }
    }).catch(function () {
      setStatus("Live: refresh failed");
    }).then(function () {
      inflight = false;
      if (then) { then(); }
      if (again) {
        again = false;
        refresh();
      }
    });
  }

  document.addEventListener("focusout", function () {
    if (waiting) {
      window.setTimeout(function () { if (waiting && !busy()) { refresh(); } }, 0);
    }
  });

  // The first connection starts at the page's watermark (`after`, the service's head read
  // before the page's data); after a resync the page's snapshot is new, and the feed starts
  // from the service's newest event.
  var source = null;
  function connect(fresh) {
    var url = fresh ? liveUrl.replace(/&after=[0-9]+/, "") : liveUrl;
    source = new EventSource(url);
    source.addEventListener("open", function () { setStatus("Live"); });
    source.addEventListener("change", function () { refresh(); });
    source.addEventListener("resync_required", function () {
      // A new snapshot, then a new stream from its cursor.
      source.close();
      setStatus("Live: resynchronising");
      refresh(function () { connect(true); });
    });
    source.addEventListener("unavailable", function () {
      source.close();
      setStatus("Live updates unavailable");
    });
    source.addEventListener("error", function () { setStatus("Live: reconnecting"); });
  }
  connect(false);
})();
