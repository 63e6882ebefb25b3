/* ANPRED dashboard: the grid of models x backends over a history database (anpred/dashboard/site.py
   writes the data block this script reads; docs/dashboard.md). Vanilla JavaScript, no network. */
(function () {
  "use strict";
  var origError = console.error;
  console.error = function () {
    window.__anpredErrors.push(Array.prototype.join.call(arguments, " "));
    return origError.apply(console, arguments);
  };
  var D = JSON.parse(document.getElementById("anpred-data").textContent);
  var STAND = ["ok", "FLAGGED", "INCOMPLETE", "NOT JUDGED"];
  var SEV = [0, 2, 1, 1];
  var VITEMS = D.vers.map(function (v) { return v ? v.split(" · ") : []; });
  var state = {model: "", backend: "", precision: "", version: "", changed: false};
  var ROWS = D.nmodels !== undefined && D.nmodels !== D.models.length; // a model has several configurations
  var BIN = 48; // sparkline points at most (wider series: the largest nRMSE of each bin)
  var EAGER = 400; // sparklines drawn at once; the others when scrolled into view
  function unrle(pairs, n, fill) { // [[index, value], ...] -> n values
    var out = new Array(n), k = 0, cur = fill;
    for (var i = 0; i < n; i++) {
      while (pairs && k < pairs.length && pairs[k][0] <= i) { cur = pairs[k][1]; k++; }
      out[i] = cur;
    }
    return out;
  }
  D.cells.forEach(function (c) {
    var n = c.s.length;
    if (!c.r) c.r = D.mr[c.m];
    c.v = unrle(c.vr, n, 0);
    c.o = unrle(c.or, n, -1);
    c.c = c.cr ? unrle(c.cr, n, null) : null;
  });

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) { if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, attrs[k]); }
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }
  function fmt(e) { // round(100 log10 x) -> "3.2e-7"
    if (e === null || e === undefined) return "-";
    return Math.pow(10, e / 100).toExponential(1).replace("e+", "e"); // "3.2e+0" -> "3.2e0"
  }
  function vdiff(a, b) { // the version items that differ between two version strings
    var A = VITEMS[a], B = VITEMS[b];
    var gone = A.filter(function (x) { return B.indexOf(x) < 0; });
    var come = B.filter(function (x) { return A.indexOf(x) < 0; });
    return gone.length || come.length ? (gone.join(", ") || "-") + " -> " + (come.join(", ") || "-") : "";
  }

  /* the points of cell c that pass the version filter; its visible events */
  function view(c) {
    var idx = [];
    for (var i = 0; i < c.r.length; i++) {
      if (!state.version || VITEMS[c.v[i]].indexOf(state.version) >= 0) idx.push(i);
    }
    var inView = {};
    idx.forEach(function (i) { inView[i] = true; });
    var ev = (c.x || []).filter(function (e) { return inView[e.p] && inView[e.q]; });
    return {idx: idx, ev: ev};
  }

  function cellVisible(c, vw) {
    var b = D.backends[c.b];
    if (state.model && D.models[c.m].toLowerCase().indexOf(state.model.toLowerCase()) < 0) return false;
    if (state.backend && b[0] !== state.backend) return false;
    if (state.precision && c.p !== state.precision) return false;
    if (!vw.idx.length) return false;
    if (state.changed && !vw.ev.length) return false;
    return true;
  }

  /* sparkline: nRMSE at the series' anchor (log scale, blue), the task metric (orange), flagged
     points (red dots), version changes (grey ticks), regressions (red triangles) */
  function spark(c, vw, W, H, detail) {
    var idx = vw.idx, n = idx.length, step = detail ? 1 : Math.max(1, Math.ceil(n / BIN));
    var bins = [], E = c.w || c.e;
    for (var s = 0; s < n; s += step) {
      var b = {e: null, t: null, fl: false, first: idx[s], last: idx[Math.min(n, s + step) - 1]};
      for (var j = s; j < Math.min(n, s + step); j++) {
        var i = idx[j], e = E[i];
        if (e !== null && (b.e === null || e > b.e)) b.e = e;
        if (c.t && c.t[i] !== null && (b.t === null || c.t[i] < b.t)) b.t = c.t[i];
        if (c.s[i] === "1") b.fl = true;
      }
      bins.push(b);
    }
    var es = bins.map(function (b) { return b.e; }).filter(function (x) { return x !== null; });
    var lo = Math.min.apply(null, es.concat([0])), hi = Math.max.apply(null, es.concat([-2000]));
    if (!es.length) { lo = -800; hi = -600; }
    if (hi - lo < 200) { var m = (hi + lo) / 2; lo = m - 100; hi = m + 100; }
    var pad = detail ? 28 : 2, top = detail ? 10 : 4, bot = detail ? 34 : 2;
    var xs = function (k) { return pad + (bins.length > 1 ? k * (W - pad - 4) / (bins.length - 1) : (W - pad) / 2); };
    var ye = function (e) { return top + (hi - e) * (H - top - bot) / (hi - lo); };
    var out = [];
    if (detail) {
      for (var dec = Math.ceil(lo / 100); dec <= Math.floor(hi / 100); dec++) {
        var y = ye(dec * 100).toFixed(1);
        out.push("<line x1='" + pad + "' x2='" + W + "' y1='" + y + "' y2='" + y + "' class=grid />",
                 "<text x='2' y='" + y + "' class=ax>1e" + dec + "</text>");
      }
    }
    var lastV = null;
    bins.forEach(function (b, k) {
      var v = c.v[b.last];
      if (lastV !== null && v !== lastV) {
        var x = xs(k).toFixed(1);
        out.push("<line x1='" + x + "' x2='" + x + "' y1='0' y2='" + H + "' class=vtick><title>" +
                 esc(vdiff(lastV, v)) + "</title></line>");
        if (detail) out.push("<text x='" + x + "' y='" + (H - 4) + "' class=vlab>" + esc(VITEMS[v].join(", ")) + "</text>");
      }
      lastV = v;
    });
    if (detail && bins.length) {
      out.push("<text x='" + pad + "' y='" + (H - 18) + "' class=vlab>" + esc(VITEMS[c.v[bins[0].first]].join(", ")) + "</text>");
    }
    var d = "", pen = false;
    bins.forEach(function (b, k) {
      if (b.e === null) { pen = false; return; }
      d += (pen ? "L" : "M") + xs(k).toFixed(1) + " " + ye(b.e).toFixed(1);
      pen = true;
    });
    if (d) out.push("<path d='" + d + "' class=le />");
    if (c.t) {
      var ts = bins.map(function (b) { return b.t; }).filter(function (x) { return x !== null; });
      if (ts.length) {
        var tlo = Math.min.apply(null, ts), thi = Math.max.apply(null, ts);
        if (thi - tlo < 500) { var tm = (thi + tlo) / 2; tlo = tm - 250; thi = tm + 250; }
        var yt = function (t) { return top + (thi - t) * (H - top - bot) / (thi - tlo); };
        var dt = "", pt = false;
        bins.forEach(function (b, k) {
          if (b.t === null) { pt = false; return; }
          dt += (pt ? "L" : "M") + xs(k).toFixed(1) + " " + yt(b.t).toFixed(1);
          pt = true;
        });
        out.push("<path d='" + dt + "' class=lt />");
      }
    }
    bins.forEach(function (b, k) {
      if (b.fl && b.e !== null) out.push("<circle cx='" + xs(k).toFixed(1) + "' cy='" + ye(b.e).toFixed(1) + "' r='" + (detail ? 3.5 : 2) + "' class=fl />");
      else if (detail && b.e !== null) out.push("<circle cx='" + xs(k).toFixed(1) + "' cy='" + ye(b.e).toFixed(1) + "' r='2.5' class=okp />");
    });
    vw.ev.forEach(function (e) {
      var k = Math.floor(idx.indexOf(e.p) / step), x = xs(k);
      var cls = e.k === "regression" ? "rg" : e.k === "fix" ? "fx" : "ch";
      out.push("<path d='M" + (x - 3.5).toFixed(1) + " " + (top - 1) + "L" + (x + 3.5).toFixed(1) + " " + (top - 1) + "L" +
               x.toFixed(1) + " " + (top + 5) + "Z' class=" + cls + "><title>" + esc(e.t) + "</title></path>");
    });
    return "<svg viewBox='0 0 " + W + " " + H + "' width='" + W + "' height='" + H + "' class=sp>" + out.join("") + "</svg>";
  }

  function cellTitle(c, vw) {
    var i = vw.idx[vw.idx.length - 1], run = D.runs[c.r[i]];
    var lines = [D.models[c.m] + " / " + D.backends[c.b][0] + " (" + D.backends[c.b][2] + ")",
                 "latest: " + STAND[+c.s[i]] + (c.o[i] >= 0 ? " at stage " + c.o[i] : "") + ", run " + run[5] + " " + run[0],
                 "versions: " + (VITEMS[c.v[i]].join(", ") || "-"),
                 "nRMSE at " + (c.a || "-") + ": " + fmt(c.e[i]) + " (largest anywhere " + fmt(c.wl) + ")"];
    if (run[3]) lines.push("campaign " + run[3] + (run[4] ? " (model " + run[4] + ")" : ""));
    if (c.k) lines.push(c.k + ": " + (c.t[i] === null ? "-" : (c.t[i] / 1e4).toFixed(4)));
    if (c.c && c.c[i]) lines.push("culprit: " + c.c[i]);
    vw.ev.forEach(function (e) {
      lines.push(e.k.toUpperCase() + ": " + e.t + (e.fb ? "; first bad version " + e.fb : "") + (e.cu ? "; culprit " + e.cu : ""));
    });
    lines.push(vw.idx.length + " runs; " + (run[1] ? "click: the report" : "report not reachable from here"));
    return lines.join("\n");
  }

  function cellHtml(c, ci, vw, eager) {
    var i = vw.idx[vw.idx.length - 1], st = +c.s[i], run = D.runs[c.r[i]];
    var label = STAND[st] + (c.o[i] >= 0 ? " s" + c.o[i] : "");
    var sub = c.c && c.c[i] && st === 1 ? c.c[i].replace(/^.*\(/, "").replace(/\)$/, "") : fmt(c.e[i] !== null ? c.e[i] : c.wl);
    var mark = "";
    if (vw.ev.some(function (e) { return e.k === "regression"; })) mark = "<span class='mk rg' title='regression'>&#9650;</span>";
    else if (vw.ev.length) mark = "<span class='mk fx' title='changed'>&#9670;</span>";
    var title = esc(cellTitle(c, vw));
    var text = "<span class=lab>" + esc(label) + "</span><span class=sub>" + esc(sub) + "</span>";
    var link = run[1] ? "<a class=rep href='" + esc(run[1]) + "' title='" + title + "'>" + text + "</a>"
                      : "<span class=rep title='" + title + "'>" + text + "</span>";
    return "<td class='c st" + st + (vw.ev.length ? " ev" : "") + "' data-cell='" + ci + "'>" + mark +
           "<div class='spw" + (eager ? "" : " lazy") + "' data-cell='" + ci + "' title='" + title + "'>" +
           (eager ? spark(c, vw, 92, 26, false) : "") + "</div>" + link + "</td>";
  }

  function renderGrid() {
    var views = D.cells.map(view);
    var byKey = {}, models = {}, backs = {};
    D.cells.forEach(function (c, ci) {
      if (!cellVisible(c, views[ci])) return;
      byKey[c.m + "/" + c.b] = ci;
      models[c.m] = true;
      backs[c.b] = true;
    });
    var mlist = Object.keys(models).map(Number).sort(function (a, b) { return a - b; });
    var blist = Object.keys(backs).map(Number).sort(function (a, b) { return a - b; });
    var h = ["<thead><tr><th class=corner>model \\ backend</th>"], drawn = 0;
    blist.forEach(function (b) {
      h.push("<th title='" + esc(D.backends[b][1] + ", " + D.backends[b][2]) + "'>" + esc(D.backends[b][0]) + "</th>");
    });
    h.push("</tr></thead><tbody>");
    mlist.forEach(function (m) {
      h.push("<tr><th class=model>" + esc(D.models[m]) + "</th>");
      blist.forEach(function (b) {
        var ci = byKey[m + "/" + b];
        h.push(ci === undefined ? "<td class='c none'></td>" : cellHtml(D.cells[ci], ci, views[ci], drawn++ < EAGER));
      });
      h.push("</tr>");
    });
    h.push("</tbody>");
    if (!D.cells.length) h = ["<caption id=empty>This history holds no run: nothing to show (runs are added by " +
                              "<code>anpred test/check --history DB</code> or a campaign).</caption>"];
    document.getElementById("grid").innerHTML = h.join("");
    lazySparklines(views);
    renderChanges(views);
    var shown = Object.keys(byKey).length;
    document.getElementById("count").textContent = shown + " cells (" + mlist.length + (ROWS ? " rows" : " models") + " x " + blist.length + " backends)";
    return shown;
  }

  var observer = null;
  function lazySparklines(views) {
    if (observer) observer.disconnect();
    var todo = document.querySelectorAll("#grid .spw.lazy");
    if (!todo.length) return;
    var draw = function (t) {
      var ci = +t.getAttribute("data-cell");
      t.innerHTML = spark(D.cells[ci], views[ci], 92, 26, false);
      t.classList.remove("lazy");
    };
    if (!window.IntersectionObserver) { todo.forEach(draw); return; }
    observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting) { draw(e.target); observer.unobserve(e.target); } });
    }, {root: document.getElementById("gridwrap"), rootMargin: "200px"});
    todo.forEach(function (t) { observer.observe(t); });
  }

  function renderChanges(views) {
    var rows = [];
    D.cells.forEach(function (c, ci) {
      if (!cellVisible(c, views[ci])) return;
      views[ci].ev.forEach(function (e) { rows.push([c, e]); });
    });
    var order = {regression: 0, change: 1, fix: 2};
    rows.sort(function (a, b) { return order[a[1].k] - order[b[1].k] || b[0].r[b[1].p] - a[0].r[a[1].p]; });
    var sec = document.getElementById("changes");
    if (!rows.length) { sec.innerHTML = "<h2>Changes</h2><p>No verdict changed and no task metric fell by more than " + D.margin + " between consecutive runs on the same inputs (in this view).</p>"; return; }
    var h = ["<h2>Changes (" + rows.length + ")</h2><table class=ch id=changes-table><thead><tr><th>model</th><th>backend</th><th>kind</th>" +
             "<th>what changed</th><th>versions</th><th>first bad version</th><th>culprit</th><th>runs</th></tr></thead><tbody>"];
    rows.slice(0, 500).forEach(function (x) {
      var c = x[0], e = x[1], ra = D.runs[c.r[e.p]], rb = D.runs[c.r[e.q]];
      var link = function (r) { return r[1] ? "<a href='" + esc(r[1]) + "'>" + r[5] + "</a>" : String(r[5]); };
      h.push("<tr class='" + e.k + "'><td>" + esc(D.models[c.m]) + "</td><td>" + esc(D.backends[c.b][0]) + "</td><td>" +
             e.k + "</td><td>" + esc(e.t) + "</td><td>" + esc(vdiff(c.v[e.q], c.v[e.p])) + "</td><td>" + esc(e.fb || "") +
             "</td><td>" + esc(e.cu || "") + "</td><td>" + link(rb) + " &rarr; " + link(ra) + "</td></tr>");
    });
    h.push("</tbody></table>");
    if (rows.length > 500) h.push("<p>" + (rows.length - 500) + " more: narrow the filters.</p>");
    sec.innerHTML = h.join("");
  }

  function renderDetail(ci) {
    var c = D.cells[ci], vw = view(c), sec = document.getElementById("detail");
    var h = ["<h2>" + esc(D.models[c.m]) + " / " + esc(D.backends[c.b][0]) + " <button id=close-detail>close</button></h2>",
             "<p>nRMSE against the consensus at <b>" + esc(c.a || "-") + "</b> (blue, log scale; red: flagged)" +
             (c.k ? ", " + esc(c.k) + " (orange)" : "") + "; grey lines: a library version changed.</p>",
             spark(c, vw, Math.min(1100, Math.max(480, 14 * vw.idx.length)), 190, true)];
    (c.bi || []).forEach(function (b) {
      h.push("<p class=bis>Bisection: first version where it changes: <b>" + esc(b.text) + "</b>" + (b.culprit ? ", culprit " + esc(b.culprit) : "") + "</p>");
    });
    h.push("<table class=pts><thead><tr><th>run</th><th>time</th><th>versions</th><th>verdict</th><th>nRMSE</th>" +
           (c.k ? "<th>" + esc(c.k) + "</th>" : "") + "<th>culprit</th><th>inputs</th></tr></thead><tbody>");
    vw.idx.slice().reverse().slice(0, 300).forEach(function (i) {
      var r = D.runs[c.r[i]];
      h.push("<tr class=st" + c.s[i] + "><td>" + (r[1] ? "<a href='" + esc(r[1]) + "'>" + r[5] + "</a>" : r[5]) + "</td><td>" + esc(r[0]) +
             "</td><td>" + esc(VITEMS[c.v[i]].join(", ")) + "</td><td>" + STAND[+c.s[i]] + (c.o[i] >= 0 ? " s" + c.o[i] : "") +
             "</td><td>" + fmt(c.e[i]) + "</td>" + (c.k ? "<td>" + (c.t[i] === null ? "-" : (c.t[i] / 1e4).toFixed(4)) + "</td>" : "") +
             "<td>" + esc((c.c && c.c[i]) || "") + "</td><td>" + esc(r[2] || "-") + "</td></tr>");
    });
    h.push("</tbody></table>");
    sec.innerHTML = h.join("");
    sec.hidden = false;
    document.getElementById("close-detail").onclick = function () { sec.hidden = true; };
    sec.scrollIntoView({block: "nearest"});
  }

  function option(sel, value, text) { var o = el("option", {value: value}, text); sel.appendChild(o); }

  function renderFilters() {
    var f = document.getElementById("filters");
    var model = el("input", {id: "f-model", type: "search", placeholder: "model contains...", list: "models"});
    var dl = el("datalist", {id: "models"});
    D.models.forEach(function (m) { option(dl, m, m); });
    var backend = el("select", {id: "f-backend"});
    option(backend, "", "all backends");
    D.backends.forEach(function (b) { option(backend, b[0], b[0]); });
    var prec = el("select", {id: "f-precision"});
    option(prec, "", "all precisions");
    Array.from(new Set(D.cells.map(function (c) { return c.p; }))).sort().forEach(function (p) { if (p) option(prec, p, p); });
    var ver = el("select", {id: "f-version"});
    option(ver, "", "all library versions");
    var items = new Set();
    VITEMS.forEach(function (v) { v.forEach(function (x) { items.add(x); }); });
    Array.from(items).sort().forEach(function (x) { option(ver, x, x); });
    var changed = el("input", {id: "f-changed", type: "checkbox"});
    var lab = el("label", {}, " only cells that changed");
    lab.insertBefore(changed, lab.firstChild);
    [model, dl, backend, prec, ver, lab, el("span", {id: "count"})].forEach(function (x) { f.appendChild(x); });
    var upd = function () {
      state.model = model.value; state.backend = backend.value; state.precision = prec.value;
      state.version = ver.value; state.changed = changed.checked;
      renderGrid();
    };
    [model, backend, prec, ver, changed].forEach(function (x) { x.addEventListener("input", upd); x.addEventListener("change", upd); });
  }

  function renderCampaign() {
    var C = D.campaign;
    if (!C) return;
    var sec = document.getElementById("campaign");
    var h = ["<h2>Configurations and runtime versions</h2><p>" + esc(C.counts || "") + "</p>"];
    h.push("<details" + (C.configs.some(function (c) { return c.state !== "complete"; }) ? " open" : "") +
           "><summary>Configurations (" + C.configs.length + ")</summary><table class=cfg><thead><tr><th>configuration</th><th>state</th><th>standing</th></tr></thead><tbody>");
    C.configs.forEach(function (c) {
      var name = c.report ? "<a href='" + esc(c.report) + "'>" + esc(c.name) + "</a>" : esc(c.name);
      h.push("<tr class='" + (c.state === "complete" ? "" : "failed") + "'><td>" + name + "</td><td>" + esc(c.state) +
             "</td><td>" + esc(c.state === "complete" ? (c.standing || "") : (c.step || "") + ": " + (c.reason || "")) + "</td></tr>");
    });
    h.push("</tbody></table></details>");
    if (C.changes && C.changes.length) {
      h.push("<h3>Per runtime version: what changed</h3><table class=ch id=version-changes><thead><tr><th>model / set / inputs</th><th>package</th>" +
             "<th>from</th><th>to</th><th>backend</th><th>before</th><th>after</th></tr></thead><tbody>");
      C.changes.forEach(function (x) {
        h.push("<tr><td>" + [x.model + " / " + x.backend_set + " / " + x.inputs, x.package, x.from, x.to, x.backend, x.before, x.after]
          .map(function (v) { return esc(v); }).join("</td><td>") + "</td></tr>");
      });
      h.push("</tbody></table>");
    } else if (C.axes && C.axes.length) {
      h.push("<p>No backend's standing changed between consecutive versions.</p>");
    }
    sec.innerHTML = h.join("");
    sec.hidden = false;
  }

  function renderSummary() {
    var nruns = D.runs.length;
    var rows = ROWS ? D.models.length + " rows (" + D.nmodels + (D.nmodels === 1 ? " model" : " models") +
      "; a row per backend set where a model has several)" : D.models.length + " models";
    document.getElementById("summary").innerHTML = esc(rows + " x " + D.backends.length + " backends, " + nruns +
      " runs; regression: a verdict changed or a task metric fell by more than " + D.margin + " against the previous run on the same inputs; " +
      "generated " + D.generated) + "<br><span class=legend><i class=st0></i>ok <i class=st1></i>flagged <i class=st2></i>incomplete " +
      "<i class=st3></i>not judged &nbsp; <b class=rg>&#9650;</b> regression <b class=fx>&#9670;</b> changed/fixed &nbsp; " +
      "<span class=le>&mdash;</span> nRMSE at the origin anchor (log) <span class=lt>&mdash;</span> task metric <span class=vt>|</span> version change</span>";
  }

  renderSummary();
  renderCampaign();
  renderFilters();
  document.getElementById("grid").addEventListener("click", function (ev) {
    var t = ev.target.closest ? ev.target.closest(".spw") : null;
    if (t) { ev.preventDefault(); renderDetail(+t.getAttribute("data-cell")); }
  });
  var shown = renderGrid();
  document.body.setAttribute("data-cells", String(shown));
  document.body.setAttribute("data-render-ms", performance.now().toFixed(0));
  requestAnimationFrame(function () { // the next frame: the grid laid out and painted
    setTimeout(function () { document.body.setAttribute("data-paint-ms", performance.now().toFixed(0)); }, 0);
  });
  document.body.setAttribute("data-errors", String(window.__anpredErrors.length));
})();
