// taskward dashboard: keeps a server-rendered page current by polling its JSON twin
// (body[data-poll]) and redrawing each [data-region] from the same region description the
// server rendered. Text only ever goes in through textContent: task data is never HTML.
(function () {
  "use strict";

  var body = document.body;
  var url = body.getAttribute("data-poll");
  var every = parseInt(body.getAttribute("data-poll-ms") || "2000", 10);
  var live = document.getElementById("live");

  function node(tag, cls, text) {
    var el = document.createElement(tag);
    if (cls) { el.className = cls; }
    if (text !== undefined && text !== null) { el.textContent = String(text); }
    return el;
  }

  function localHref(href) {
    return typeof href === "string" && href.charAt(0) === "/" && href.charAt(1) !== "/";
  }

  function linkOrText(text, href) {
    if (localHref(href)) {
      var a = node("a", null, text);
      a.setAttribute("href", href);
      return a;
    }
    return document.createTextNode(String(text));
  }

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  function actionForm(a) {
    var form = node("form", "inline action");
    form.setAttribute("method", "post");
    if (localHref(a.href)) { form.setAttribute("action", a.href); }
    var token = node("input");
    token.setAttribute("type", "hidden");
    token.setAttribute("name", "csrf_token");
    token.setAttribute("value", csrfToken());
    form.appendChild(token);
    var fields = a.fields || {};
    Object.keys(fields).forEach(function (name) {  // what the button posts (a limit's key)
      var input = node("input");
      input.setAttribute("type", "hidden");
      input.setAttribute("name", name);
      input.setAttribute("value", String(fields[name]));
      form.appendChild(input);
    });
    var button = node("button", null, a.label);
    button.setAttribute("type", "submit");
    form.appendChild(button);
    return form;
  }

  var build = {
    table: function (r) {
      var table = node("table");
      var head = node("thead");
      var tr = node("tr");
      r.columns.forEach(function (c) { tr.appendChild(node("th", null, c)); });
      head.appendChild(tr);
      table.appendChild(head);
      var tbody = node("tbody");
      if (!r.rows.length) {
        var empty = node("td", "empty", r.empty);
        empty.setAttribute("colspan", String(r.columns.length));
        var row = node("tr");
        row.appendChild(empty);
        tbody.appendChild(row);
      }
      r.rows.forEach(function (cells) {
        var row = node("tr");
        cells.forEach(function (c) {
          var td = node("td", c.cls || null);
          if (c.title) { td.setAttribute("title", String(c.title)); }
          if (c.check) {  // a selection box of the list's bulk form
            var box = node("input", "select");
            box.setAttribute("type", "checkbox");
            box.setAttribute("name", "task_id");
            box.setAttribute("value", String(c.check));
            box.setAttribute("form", "bulk-form");
            box.setAttribute("aria-label", String(c.label || "select"));
            td.appendChild(box);
          } else if (c.actions) {
            c.actions.forEach(function (a) { td.appendChild(actionForm(a)); });
          } else if (c.links) {  // several links in one cell (a worker's leases)
            c.links.forEach(function (l, i) {
              if (i) { td.appendChild(document.createTextNode(" ")); }
              td.appendChild(linkOrText(l.text, l.href));
            });
          } else {
            td.appendChild(linkOrText(c.text, c.href));
          }
          row.appendChild(td);
        });
        tbody.appendChild(row);
      });
      table.appendChild(tbody);
      return table;
    },
    fields: function (r) {
      if (!r.items.length) { return node("p", "empty", r.empty || "none"); }
      var dl = node("dl");
      r.items.forEach(function (i) {
        dl.appendChild(node("dt", null, i.label));
        var dd = node("dd", i.cls || null);
        if (!i.href && typeof i.at === "number") {
          dd.appendChild(timeNode(null, i.text, i.at, i.iso));
        } else {
          dd.appendChild(linkOrText(i.text, i.href));
        }
        dd.setAttribute("data-field", i.key);
        dl.appendChild(dd);
      });
      return dl;
    },
    pre: function (r) {
      var pre = node("pre", null, r.text);
      pre.setAttribute("tabindex", "0");  // a scrolling block is reachable by keyboard
      return pre;
    },
    timeline: function (r) {
      var ol = node("ol", "timeline");
      r.items.forEach(function (i) {
        var li = node("li", i.cls || null);
        li.appendChild(timeNode("time", i.time, i.at, i.iso));
        li.appendChild(document.createTextNode(" "));
        li.appendChild(node("strong", null, i.title));
        li.appendChild(document.createTextNode(" "));
        li.appendChild(node("span", "detail", i.detail));
        if (i.actor) {
          li.appendChild(document.createTextNode(" "));
          li.appendChild(node("span", "actor", "by " + i.actor));
        }
        if (i.lease) {
          li.appendChild(document.createTextNode(" "));
          li.appendChild(node("span", "lease", "lease " + i.lease));
        }
        ol.appendChild(li);
      });
      return ol;
    },
    link: function (r) {
      return localHref(r.href) ? linkOrText(r.text, r.href) : document.createTextNode("");
    },
    text: function (r) { return document.createTextNode(String(r.text)); }
  };

  function timeNode(cls, text, at, iso) {
    var t = node("time", cls, text);
    if (iso) { t.setAttribute("datetime", String(iso)); }
    if (typeof at === "number") { t.setAttribute("data-at", String(at)); }
    return t;
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // The pages' own format: 2026-12-05 09:30:12 UTC (the live clock and local times use it).
  function fmtUtc(d) {
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) +
      " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  function zoneName() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { return ""; }
  }

  function fmtLocal(d) {
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + zoneName();
  }

  // Each instant the server wrote in UTC gets the reader's local time beside it (when the
  // reader's zone is not UTC itself).
  function localize(root) {
    var zone = zoneName();
    if (!zone || zone === "UTC" || zone === "Etc/UTC") { return; }
    root.querySelectorAll("time[data-at]").forEach(function (t) {
      if (t.querySelector(".local")) { return; }
      var at = parseFloat(t.getAttribute("data-at"));
      if (isNaN(at)) { return; }
      t.appendChild(node("span", "local", "local " + fmtLocal(new Date(at * 1000))));
    });
  }

  function selectedIds() {
    return Array.prototype.map.call(
      document.querySelectorAll('input.select[name="task_id"]:checked'),
      function (box) { return box.value; }
    );
  }

  function syncSelection() {
    var n = selectedIds().length;
    var count = document.getElementById("selected-count");
    if (count) { count.textContent = n + " selected"; }
    ["bulk-retry-selected", "bulk-cancel-selected"].forEach(function (id) {
      var b = document.getElementById(id);
      if (b) { b.disabled = n === 0; }
    });
    var all = document.getElementById("select-all");
    if (all) {
      var boxes = document.querySelectorAll('input.select[name="task_id"]');
      all.checked = boxes.length > 0 && n === boxes.length;
    }
  }

  function apply(regions) {
    Object.keys(regions).forEach(function (name) {
      var r = regions[name];
      var el = document.querySelector('[data-region="' + name.replace(/["\\]/g, "") + '"]');
      if (!el || !r) { return; }
      if (r.kind === "toggle") {
        el.hidden = !r.visible;
        return;
      }
      if (r.kind === "value") {  // a form field the page keeps current (bulk retry's ids)
        el.value = String(r.value);
        return;
      }
      var make = build[r.kind];
      if (!make) { return; }
      var kept = {};  // the selection survives a redraw
      el.querySelectorAll("input.select:checked").forEach(function (b) { kept[b.value] = true; });
      el.replaceChildren(make(r));
      el.querySelectorAll("input.select").forEach(function (b) { b.checked = !!kept[b.value]; });
      localize(el);
    });
    syncSelection();
  }

  function setLive(ok) {
    if (!live) { return; }
    live.textContent = ok ? "live · " + fmtUtc(new Date()) : "offline · retrying";
    live.className = "live-indicator " + (ok ? "ok" : "down");
  }

  function poll() {
    if (document.hidden) { setTimeout(poll, every); return; }
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (res) {
        if (res.status === 401) {
          window.location.href = "/login?next=" + encodeURIComponent(window.location.pathname + window.location.search);
          throw new Error("login required");
        }
        if (!res.ok) { throw new Error("HTTP " + res.status); }
        return res.json();
      })
      .then(function (data) { apply(data.regions || {}); setLive(true); })
      .catch(function () { setLive(false); })
      .then(function () { setTimeout(poll, every); });
  }

  // A button with data-confirm asks first ({n}: how many tasks are selected).
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var ask = button && button.getAttribute("data-confirm");
    if (ask && !window.confirm(ask.replace("{n}", String(selectedIds().length)))) {
      event.preventDefault();
    }
  });

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "select-all") {
      document.querySelectorAll('input.select[name="task_id"]').forEach(function (b) {
        b.checked = target.checked;
      });
    }
    if (target && (target.id === "select-all" || target.classList.contains("select"))) {
      syncSelection();
    }
  });

  var selectAll = document.querySelector("label.select-all");
  if (selectAll) { selectAll.hidden = false; }
  localize(document);
  syncSelection();
  if (url) { setTimeout(poll, every); }
})();
