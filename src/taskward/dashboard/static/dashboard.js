// taskward dashboard: keeps a server-rendered page current by polling its JSON twin
// (body[data-poll]) and redrawing each [data-region] from the same region description the
// server rendered. Text only ever goes in through textContent: task data is never HTML.
(function () {
  "use strict";

  var body = document.body;
  var url = body.getAttribute("data-poll");
  if (!url) { return; }
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
          if (c.actions) {
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
      var dl = node("dl");
      r.items.forEach(function (i) {
        dl.appendChild(node("dt", null, i.label));
        var dd = node("dd", i.cls || null);
        dd.appendChild(linkOrText(i.text, i.href));
        dd.setAttribute("data-field", i.key);
        dl.appendChild(dd);
      });
      return dl;
    },
    pre: function (r) { return node("pre", null, r.text); },
    timeline: function (r) {
      var ol = node("ol", "timeline");
      r.items.forEach(function (i) {
        var li = node("li", i.cls || null);
        li.appendChild(node("span", "time", i.time));
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
      if (make) { el.replaceChildren(make(r)); }
    });
  }

  function setLive(ok) {
    if (!live) { return; }
    live.textContent = ok ? "live · " + new Date().toLocaleTimeString() : "offline · retrying";
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

  setTimeout(poll, every);
})();
