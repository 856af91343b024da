/* agentgym view: the run viewer's page. Vanilla JavaScript, no build step, no dependencies.
 *
 * Data comes as documents (see agentgym/view/site.py): over HTTP from `agentgym view` (fetch
 * data/<path>.json) or, in an export opened from the file system, from data/<path>.js files that call
 * AGV.put(path, doc). Everything taken from a run is inserted with textContent / createTextNode: nothing
 * from a transcript is ever parsed as HTML.
 */
(function () {
  "use strict";

  var MODE = (document.querySelector('meta[name="agentgym-view-mode"]') || {}).content || "server";
  var SVGNS = "http://www.w3.org/2000/svg";
  var PAGE = 200;
  // an eval summary's success.method, worded as the trainer prints it (analysis.py's _INTERVAL_KINDS)
  var INTERVAL_KINDS = { "wilson": "Wilson 95% over episodes", "bootstrap over tasks": "95% bootstrap over tasks" };
  var AGV = (window.AGV = window.AGV || {});

  // ------------------------------------------------------------------------------------------- data
  var docs = new Map();
  var waiting = new Map();

  AGV.put = function (path, doc) {
    docs.set(path, doc);
    var w = waiting.get(path);
    if (w) { waiting.delete(path); w.resolve(doc); }
  };

  function encodePath(path) { return path.split("/").map(encodeURIComponent).join("/"); }

  function load(path) {
    if (docs.has(path)) return Promise.resolve(docs.get(path));
    if (waiting.has(path)) return waiting.get(path).promise;
    var w = {};
    w.promise = new Promise(function (resolve, reject) { w.resolve = resolve; w.reject = reject; });
    waiting.set(path, w);
    if (MODE === "static") {
      var s = document.createElement("script");
      s.src = "data/" + encodePath(path) + ".js";
      s.onerror = function () {
        s.remove();
        if (waiting.get(path) === w) { waiting.delete(path); w.reject(new Error("no data file data/" + path + ".js in this export")); }
      };
      s.onload = function () {
        s.remove();
        if (waiting.get(path) === w) { waiting.delete(path); w.reject(new Error("data/" + path + ".js did not hold " + path)); }
      };
      document.head.appendChild(s);
    } else {
      fetch("data/" + encodePath(path) + ".json", { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          return r.json().then(function (body) {
            if (!r.ok) throw new Error((body && body.error) || ("HTTP " + r.status));
            return body;
          }, function () { throw new Error("HTTP " + r.status + " for " + path); });
        })
        .then(function (doc) { waiting.delete(path); docs.set(path, doc); w.resolve(doc); },
              function (e) { waiting.delete(path); w.reject(e); });
    }
    return w.promise;
  }

  // ------------------------------------------------------------------------------------------- DOM
  /* h(tag, props, ...children): props may hold class, title, href (internal "#/..." only), type, value,
     placeholder, onclick/oninput/onchange/onkeydown, colspan, data-*; children are nodes or text. */
  function h(tag, props) {
    var el = document.createElement(tag);
    if (props) {
      Object.keys(props).forEach(function (k) {
        var v = props[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "class") el.className = v;
        else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
        else if (k === "href") el.setAttribute("href", safeHref(v));
        else if (k === "value") el.value = v;
        else el.setAttribute(k, String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }

  function append(el, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) { c.forEach(function (x) { append(el, x); }); return; }
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }

  function safeHref(v) { v = String(v); return v.charAt(0) === "#" ? v : "#/"; }

  function svg(tag, attrs) {
    var el = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function setMain() {
    var main = document.getElementById("main");
    main.replaceChildren.apply(main, arguments);
    window.scrollTo(0, 0);
  }

  function status(text) { document.getElementById("status").textContent = text || ""; }

  // ------------------------------------------------------------------------------------------- format
  function isNum(x) { return typeof x === "number" && isFinite(x); }
  function pct(x) { return isNum(x) ? (100 * x).toFixed(1) + "%" : "–"; }
  function num(x, d) {
    if (!isNum(x)) return x === null || x === undefined ? "–" : String(x);
    if (Number.isInteger(x)) return x.toLocaleString("en-US");
    var a = Math.abs(x);
    return x.toFixed(d !== undefined ? d : a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3);
  }
  function secs(x) { return isNum(x) ? (x >= 100 ? x.toFixed(0) : x >= 1 ? x.toFixed(2) : (1000 * x).toFixed(0) + " m") + "s" : "–"; }
  function ciText(ci) { return Array.isArray(ci) && isNum(ci[0]) && isNum(ci[1]) ? "[" + (100 * ci[0]).toFixed(1) + ", " + (100 * ci[1]).toFixed(1) + "]" : ""; }
  function successCell(mean, ci, title) {
    return h("span", { title: title || null }, pct(mean), ci && ciText(ci) ? h("span", { class: "ci" }, ciText(ci)) : null);
  }
  function short(env) { return String(env).replace(/^agentgym\//, ""); }
  function badge(text, kind, title) { return h("span", { class: "badge b-" + kind, title: title || null }, text); }
  function jsonText(v) { try { return JSON.stringify(v, null, 1); } catch (e) { return String(v); } }

  function outcomeBadges(r) {
    var out = [];
    out.push(r.success ? badge("success", "ok") : badge("fail", "bad"));
    if (r.truncated) out.push(badge("truncated" + (r.reason ? ": " + r.reason : ""), "warn"));
    if (r.early_stopped) out.push(badge("early-stopped", "warn"));
    if (r.error) out.push(badge("error" + (r.error_source ? " (" + r.error_source + ")" : ""), "bad", r.error));
    if (r.parse_errors > 0) out.push(badge(r.parse_errors + " parse error" + (r.parse_errors > 1 ? "s" : ""), "warn"));
    return out;
  }

  function kvTable(obj) {
    var rows = Object.keys(obj || {}).map(function (k) {
      var v = obj[k];
      var cell = v !== null && typeof v === "object" ? h("pre", null, jsonText(v)) : String(v === null ? "null" : v);
      return h("tr", null, h("td", null, k), h("td", { class: "wrap" }, cell));
    });
    return h("table", { class: "kv" }, h("tbody", null, rows));
  }

  function table(headers, rows) {
    return h("div", { class: "tablewrap" }, h("table", null,
      h("thead", null, h("tr", null, headers.map(function (x) {
        return typeof x === "string" ? h("th", null, x) : h("th", { class: x.num ? "num" : null, title: x.title || null }, x.label);
      }))),
      h("tbody", null, rows)));
  }

  // ------------------------------------------------------------------------------------------- filters
  /* Pure functions over one episode row (a run document's table, one entry per column) and one
     episode (a chunk document's entry); the page and its tests use them. */
  function rowsOf(tbl) {
    var cols = Object.keys(tbl || {});
    var n = cols.length ? tbl[cols[0]].length : 0;
    var out = new Array(n);
    for (var i = 0; i < n; i++) {
      var r = {};
      for (var j = 0; j < cols.length; j++) r[cols[j]] = tbl[cols[j]][i];
      out[i] = r;
    }
    return out;
  }

  function tri(want, have) { return !want || (want === "yes" ? !!have : !have); }

  function rowMatches(r, f) {
    if (!f) return true;
    if (f.env && r.env !== f.env) return false;
    if (f.type && r.type !== f.type) return false;
    if (f.task && String(r.task).toLowerCase().indexOf(String(f.task).toLowerCase()) < 0) return false;
    if (f.seed !== undefined && f.seed !== "" && String(r.seed) !== String(f.seed)) return false;
    if (!tri(f.success, r.success)) return false;
    if (!tri(f.truncated, r.truncated)) return false;
    if (!tri(f.error, r.error)) return false;
    if (!tri(f.parse_errors, r.parse_errors > 0)) return false;
    return true;
  }

  function episodeText(ep) {
    var parts = [ep.task, ep.env, ep.type, ep.error || ""];
    (ep.opening || []).forEach(function (m) { parts.push(m.content); });
    (ep.turns || []).forEach(function (t) {
      parts.push(t.text, t.parse_error || "");
      (t.tool_calls || []).forEach(function (c) { parts.push(c.name, c.arguments); });
      (t.observation || []).forEach(function (m) { parts.push(m.name || "", m.content); });
    });
    return parts.join("\n").toLowerCase();
  }

  function textMatches(ep, query) {
    var terms = String(query || "").toLowerCase().split(/\s+/).filter(Boolean);
    if (!terms.length) return true;
    var text = episodeText(ep);
    return terms.every(function (t) { return text.indexOf(t) >= 0; });
  }

  AGV.filters = { rowsOf: rowsOf, rowMatches: rowMatches, textMatches: textMatches, episodeText: episodeText };

  // ------------------------------------------------------------------------------------------- state
  var state = { index: null, filters: {}, search: {}, sort: {}, limit: {}, gfilters: {}, glimit: {}, cmpFilter: {}, extra: {} };
  var rowCache = new WeakMap();
  function rowsOfDoc(doc, key) {
    var c = rowCache.get(doc);
    if (!c) { c = {}; rowCache.set(doc, c); }
    if (!c[key]) c[key] = rowsOf(doc[key]);
    return c[key];
  }
  function runInfo(id) { return state.index.runs[id]; }
  function chunkOf(id, size) { return Math.floor(id / size); }

  function episodeDoc(runId, epId, size) {
    return load("run/" + runId + "/chunk/" + chunkOf(epId, size)).then(function (c) {
      var ep = c.episodes[epId - chunkOf(epId, size) * size];
      if (!ep || ep.id !== epId) throw new Error("episode " + epId + " is not in run " + runId);
      return ep;
    });
  }

  // ------------------------------------------------------------------------------------------- shell
  function crumbs(items) {
    var nav = document.getElementById("crumbs");
    var out = [];
    items.forEach(function (it, i) {
      if (i) out.push(h("span", { class: "sep" }, "›"));
      out.push(it.href ? h("a", { href: it.href }, it.label) : h("span", null, it.label));
    });
    nav.replaceChildren.apply(nav, out);
  }

  function runCrumbs(run) {
    var items = [];
    if (run.parent !== null && run.parent !== undefined) {
      var p = runInfo(run.parent);
      items.push({ label: p.name, href: "#/run/" + p.id });
      items.push({ label: run.stage, href: "#/run/" + run.id });
    } else items.push({ label: run.name, href: "#/run/" + run.id });
    return items;
  }

  function sidebar(activeHash) {
    var side = document.getElementById("side");
    var idx = state.index;
    var list = h("ul");
    idx.runs.forEach(function (r) {
      var href = "#/run/" + r.id;
      var label = r.parent === null || r.parent === undefined ? r.name : r.stage;
      list.appendChild(h("li", { class: r.parent === null || r.parent === undefined ? null : "child" },
        h("a", { href: href, class: activeHash === href ? "active" : null, title: r.path },
          label, h("span", { class: "kind" }, r.kind === "train" ? "train" : r.kind === "episodes" ? "jsonl" : ""))));
    });
    var cmp = h("ul");
    idx.comparisons.forEach(function (ids) {
      var href = "#/compare/" + ids.join(",");
      cmp.appendChild(h("li", null, h("a", { href: href, class: activeHash === href ? "active" : null }, comparisonLabel(ids))));
    });
    var parts = [h("h3", null, "Runs"), list];
    if (idx.comparisons.length) parts.push(h("h3", null, "Comparisons"), cmp);
    if (MODE === "server") {
      parts.push(h("h3", null, "Data"), h("button", { onclick: reload, title: "Read the run folders again (a run in progress shows its new episodes)" }, "Reload"));
    } else parts.push(h("p", { class: "muted small" }, "Static export: the data as it was when exported."));
    side.replaceChildren.apply(side, parts);
  }

  /* "grpo: before → after" for stages of one training run, else the runs' labels */
  function comparisonLabel(ids) {
    var runs = ids.map(runInfo);
    var parent = runs[0].parent;
    if (parent !== null && parent !== undefined && runs.every(function (r) { return r.parent === parent; })) {
      return runInfo(parent).name + ": " + runs.map(function (r) { return r.stage; }).join(" → ");
    }
    return runs.map(function (r) { return r.name; }).join(" → ");
  }

  function reload() {
    docs.clear(); state.search = {};
    load("index").then(function (idx) { state.index = idx; route(); }, showError);
  }

  function showError(e) {
    status("");
    setMain(h("div", { class: "errbox" }, String((e && e.message) || e)));
  }

  // ------------------------------------------------------------------------------------------- overview
  function renderOverview() {
    crumbs([]);
    var idx = state.index;
    var cards = idx.runs.filter(function (r) { return r.parent === null || r.parent === undefined; }).map(function (r) {
      var body = [];
      if (r.kind === "eval") {
        body.push(h("div", { class: "big" }, r.success ? successCell(r.success.mean, r.success.ci95, r.success.interval) : "–"));
        body.push(h("div", { class: "muted small" }, [r.policy ? "policy " + r.policy : null, (r.envs || []).map(short).join(", "),
          isNum(r.episodes) ? r.episodes + " episodes" : null].filter(Boolean).join(" · ")));
      } else if (r.kind === "train") {
        var res = r.result || {};
        var b = res.before && res.before.success, a = res.after && res.after.success;
        body.push(h("div", { class: "big" }, isNum(b) || isNum(a) ? pct(b) + " → " + pct(a) :
          h("span", { class: "muted small" }, r.result && Object.keys(r.result).length ? "no held-out eval before and after" : "no result.json yet (running, or stopped)")));
        body.push(h("div", { class: "muted small" }, [r.algorithm, isNum(res.steps) ? res.steps + " steps" : null,
          r.children.length + (r.children.length === 1 ? " held-out eval" : " held-out evals"), r.has_groups ? "groups logged" : null].filter(Boolean).join(" · ")));
      } else body.push(h("div", { class: "muted small" }, "trajectory file"));
      return h("a", { href: "#/run/" + r.id, class: "card", style: null },
        h("div", { class: "title" }, r.name), h("div", { class: "muted small" }, r.kind), body);
    });
    var parts = [h("h1", null, "Runs"), h("div", { class: "sub" }, idx.runs.length + " runs"), h("div", { class: "cards" }, cards)];
    if (idx.comparisons.length) {
      parts.push(h("h2", null, "Comparisons"));
      parts.push(h("ul", null, idx.comparisons.map(function (ids) {
        return h("li", null, h("a", { href: "#/compare/" + ids.join(",") }, comparisonLabel(ids)));
      })));
    }
    setMain.apply(null, parts);
  }

  // ------------------------------------------------------------------------------------------- eval run
  function summaryTable(summary) {
    var envs = summary.envs || {};
    var names = Object.keys(envs);
    var blocks = names.map(function (e) { return [short(e), envs[e]]; });
    if (names.length > 1 && summary.overall && summary.overall.episodes) blocks.push(["overall", summary.overall]);
    var ks = {};
    blocks.forEach(function (b) { Object.keys(b[1].pass_at_k || {}).forEach(function (k) { ks[k] = 1; }); });
    var passKeys = Object.keys(ks);
    var rows = blocks.map(function (b) {
      var s = b[1].success || {}, p = b[1].parse_errors || {}, t = b[1].tokens || {}, tm = b[1].timings || {};
      var reasons = Object.keys(b[1].truncated_reasons || {}).map(function (k) { return k + " " + b[1].truncated_reasons[k]; }).join(", ");
      return h("tr", null,
        h("td", null, b[0]),
        h("td", { class: "num" }, num(b[1].episodes)),
        h("td", { class: "num" }, successCell(s.mean, s.ci95 || s.wilson95, s.ci95 ? (INTERVAL_KINDS[s.method] || "95% CI over seeds") : "Wilson 95%")),
        h("td", { class: "num" }, passKeys.map(function (k, i) {
          var v = (b[1].pass_at_k || {})[k];
          return h("div", { title: v && v.ci95 ? k + " " + ciText(v.ci95) + " (95% CI over seeds)" : null }, k.replace("pass@", "@") + " " + (v ? pct(v.mean) : "–"));
        })),
        h("td", { class: "num" }, num((b[1].reward || {}).mean)),
        h("td", { class: "num" }, num((b[1].turns || {}).mean)),
        h("td", { class: "num" }, num(t.generated_mean, 0) + " / " + num(t.prompt_mean, 0)),
        h("td", { class: "num" }, num(p.total) + (isNum(p.per_turn) ? " (" + p.per_turn.toFixed(2) + "/turn)" : "")),
        h("td", { class: "num", title: reasons || null }, num(b[1].truncated)),
        h("td", { class: "num", title: (b[1].error_examples || []).join("\n") || null }, num(b[1].errors)),
        h("td", { class: "num" }, secs(tm.episode_wall_mean_s)));
    });
    var heads = ["env", { label: "episodes", num: 1 }, { label: "success [95% CI]", num: 1 }]
      .concat(passKeys.length ? [{ label: "pass@k", num: 1, title: "unbiased pass@k, mean over seeds" }] : [])
      .concat([{ label: "reward", num: 1 }, { label: "turns", num: 1 }, { label: "tokens gen / prompt", num: 1, title: "mean per episode" },
        { label: "parse errors", num: 1 }, { label: "truncated", num: 1 }, { label: "errors", num: 1 }, { label: "s / episode", num: 1 }]);
    return table(heads, rows);
  }

  function breakdownTable(blocks) {
    var ks = {};
    blocks.forEach(function (b) { Object.keys(b.pass_at_k || {}).forEach(function (k) { ks[k] = 1; }); });
    var passKeys = Object.keys(ks).sort(function (a, b) { return +a.replace("pass@", "") - +b.replace("pass@", ""); });
    var rows = blocks.map(function (b) {
      return h("tr", null,
        h("td", null, b.type === null ? h("b", null, short(b.env)) : ""),
        h("td", null, b.type === null ? h("span", { class: "muted" }, "all types") : b.type),
        h("td", { class: "num" }, num(b.episodes)),
        h("td", { class: "num" }, successCell(b.success, b.wilson95, "Wilson 95% interval")),
        passKeys.length ? h("td", { class: "num", "data-passk": "" }, passKeys.map(function (k) {
          var v = (b.pass_at_k || {})[k];
          return h("div", null, k.replace("pass@", "@") + " " + (isNum(v) ? pct(v) : "–"));
        })) : null,
        h("td", { class: "num" }, num(b.reward_mean)),
        h("td", { class: "num" }, num(b.turns_mean)),
        h("td", { class: "num" }, num(b.gen_tokens_mean, 0) + " / " + num(b.prompt_tokens_mean, 0)),
        h("td", { class: "num" }, num(b.parse_errors) + (isNum(b.parse_errors_per_turn) ? " (" + b.parse_errors_per_turn.toFixed(2) + "/turn)" : "")),
        h("td", { class: "num" }, num(b.truncated)),
        h("td", { class: "num" }, num(b.errors)));
    });
    return table(["env", "task type", { label: "episodes", num: 1 }, { label: "success [Wilson 95%]", num: 1 }]
      .concat(passKeys.length ? [{ label: "pass@k", num: 1, title: "unbiased pass@k: per seed the mean over tasks, then the mean over seeds" }] : [])
      .concat([{ label: "reward", num: 1 },
      { label: "turns", num: 1 }, { label: "tokens gen / prompt", num: 1 }, { label: "parse errors", num: 1 },
      { label: "truncated", num: 1 }, { label: "errors", num: 1 }]), rows);
  }

  var SORTS = {
    id: function (r) { return r.id; }, env: function (r) { return r.env; }, task: function (r) { return r.task; },
    seed: function (r) { return r.seed; }, sample: function (r) { return r.sample; }, reward: function (r) { return r.reward; }, turns: function (r) { return r.turns; },
    tokens: function (r) { return r.gen_tokens; }, perr: function (r) { return r.parse_errors; }, wall: function (r) { return r.wall_s; },
    outcome: function (r) { return (r.success ? 2 : 0) + (r.error ? -1 : 0); }
  };

  function filteredRows(runId, doc) {
    var rows = rowsOfDoc(doc, "table");
    var f = state.filters[runId] || {};
    var hits = state.search[runId] && state.search[runId].done ? state.search[runId].ids : null;
    var out = rows.filter(function (r) { return rowMatches(r, f) && (!hits || hits.has(r.id)); });
    var s = state.sort[runId];
    if (s && SORTS[s.key]) {
      var key = SORTS[s.key], dir = s.dir;
      out.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === y) return a.id - b.id;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    return out;
  }

  function runSearch(runId, doc, query, rerender) {
    var n = doc.episodes, size = doc.chunk_size, chunks = Math.ceil(n / size);
    var job = { q: query, ids: new Set(), done: false, scanned: 0 };
    state.search[runId] = job;
    if (!query.trim()) { delete state.search[runId]; rerender(); return; }
    var k = 0;
    function next() {
      if (state.search[runId] !== job) return;
      if (k >= chunks) { job.done = true; status(""); rerender(); return; }
      status("searching " + (k + 1) + " / " + chunks + " chunks");
      load("run/" + runId + "/chunk/" + k).then(function (c) {
        c.episodes.forEach(function (ep) { if (textMatches(ep, query)) job.ids.add(ep.id); });
        job.scanned += c.episodes.length; k++; next();
      }, function (e) { status(""); showError(e); });
    }
    next();
  }

  function filterBar(runId, doc, rerender) {
    var rows = rowsOfDoc(doc, "table");
    var f = state.filters[runId] = state.filters[runId] || {};
    function uniq(key) {
      var s = {}; rows.forEach(function (r) { s[r[key] === null || r[key] === undefined ? "" : r[key]] = 1; });
      return Object.keys(s).filter(function (x) { return x !== ""; }).sort(function (a, b) { return isNaN(a) || isNaN(b) ? (a < b ? -1 : 1) : a - b; });
    }
    function sel(label, key, options) {
      return h("label", null, label, h("select", { "data-filter": key, onchange: function (e) { f[key] = e.target.value; state.limit[runId] = PAGE; rerender(); } },
        options.map(function (o) {
          var el = h("option", { value: o[0] }, o[1]);
          if (String(f[key] || "") === String(o[0])) el.selected = true;
          return el;
        })));
    }
    var any = [["", "any"]];
    var envs = uniq("env"), types = uniq("type"), seeds = uniq("seed");
    var yesno = function (y, n) { return any.concat([["yes", y], ["no", n]]); };
    var search = h("input", { type: "search", placeholder: "search text (Enter)", value: state.search[runId] ? state.search[runId].q : "",
      "aria-label": "search episode text",
      onkeydown: function (e) { if (e.key === "Enter") { state.limit[runId] = PAGE; runSearch(runId, doc, e.target.value, rerender); } } });
    return h("div", { class: "filters" },
      envs.length > 1 ? sel("env", "env", any.concat(envs.map(function (e) { return [e, short(e)]; }))) : null,
      types.length > 1 ? sel("type", "type", any.concat(types.map(function (t) { return [t, t]; }))) : null,
      h("label", null, "task", h("input", { type: "text", "data-filter": "task", value: f.task || "", placeholder: "task id contains", size: 12,
        oninput: function (e) { f.task = e.target.value; state.limit[runId] = PAGE; rerenderList(); } })),
      seeds.length > 1 ? sel("seed", "seed", any.concat(seeds.map(function (s) { return [s, s]; }))) : null,
      sel("outcome", "success", yesno("success", "failure")),
      sel("truncated", "truncated", yesno("yes", "no")),
      sel("error", "error", yesno("yes", "no")),
      sel("parse errors", "parse_errors", yesno("some", "none")),
      search);
    function rerenderList() { var box = document.getElementById("eplist"); if (box) box.replaceWith(episodeList(runId, doc, rerender)); }
  }

  function episodeList(runId, doc, rerender) {
    var rows = filteredRows(runId, doc);
    var limit = state.limit[runId] || PAGE;
    var s = state.sort[runId] || {};
    function th(label, key, isNumCol) {
      var arrow = s.key === key ? (s.dir > 0 ? " ▲" : " ▼") : "";
      return h("th", { class: "sortable" + (isNumCol ? " num" : ""), onclick: function () {
        state.sort[runId] = { key: key, dir: s.key === key ? -s.dir : 1 }; rerender();
      } }, label + arrow);
    }
    var search = state.search[runId];
    var body = rows.slice(0, limit).map(function (r) {
      return h("tr", { class: "click", "data-episode": r.id, onclick: function () { location.hash = "#/run/" + runId + "/ep/" + r.id; } },
        h("td", { class: "num" }, r.id), h("td", null, short(r.env)), h("td", { class: "wrap" }, r.task), h("td", null, r.type),
        h("td", { class: "num" }, r.seed === null ? "–" : r.seed), h("td", { class: "num" }, r.sample === null ? "–" : r.sample),
        h("td", null, outcomeBadges(r)), h("td", { class: "num" }, num(r.reward)), h("td", { class: "num" }, r.turns),
        h("td", { class: "num" }, num(r.gen_tokens)), h("td", { class: "num" }, num(r.parse_errors)), h("td", { class: "num" }, secs(r.wall_s)));
    });
    var count = rows.length + " of " + doc.episodes + " episodes" + (search && !search.done ? " (searching…)" : search ? " matching “" + search.q + "”" : "");
    return h("div", { id: "eplist" },
      h("div", { class: "count", id: "epcount" }, count),
      h("div", { class: "tablewrap" }, h("table", null,
        h("thead", null, h("tr", null, th("#", "id", 1), th("env", "env"), th("task", "task"), h("th", null, "type"), th("seed", "seed", 1), th("sample", "sample", 1),
          th("outcome", "outcome"), th("reward", "reward", 1), th("turns", "turns", 1), th("tokens", "tokens", 1), th("parse err", "perr", 1), th("time", "wall", 1))),
        h("tbody", null, body))),
      rows.length > limit ? h("div", { class: "more" }, h("button", { onclick: function () { state.limit[runId] = limit + PAGE; rerender(); } },
        "Show " + Math.min(PAGE, rows.length - limit) + " more")) : null);
  }

  function renderEval(run) {
    return load("run/" + run.id).then(function (doc) {
      crumbs(runCrumbs(run));
      var summary = doc.summary;
      var proto = (summary && summary.protocol) || (doc.run_json && doc.run_json.protocol) || null;  // run.json: written at the start
      var here = location.hash;
      function rerender() {
        if (location.hash !== here) return;  // the user went elsewhere (a search finishing late)
        var y = window.scrollY;
        var fresh = view();
        var main = document.getElementById("main");
        main.replaceChildren.apply(main, fresh);
        window.scrollTo(0, y);
      }
      function view() {
        var sub = [run.path];
        if (proto) {
          if (proto.policy) sub.push("policy " + (proto.policy.spec || proto.policy.policy_id || "?"));
          sub.push("split " + (proto.split || "?"), "seeds " + jsonText(proto.seeds), "samples " + proto.samples);
        }
        var parts = [h("h1", null, run.stage ? runInfo(run.parent).name + " › " + run.stage : run.name), h("div", { class: "sub" }, sub.join(" · "))];
        if (summary && summary.complete === false) parts.push(h("div", { class: "warnbox" }, "This run did not finish (summary.json says complete: false)."));
        if (doc.skipped_lines) parts.push(h("div", { class: "warnbox" }, doc.skipped_lines + " line(s) of episodes.jsonl could not be read (an interrupted write) and are left out."));
        if (summary && summary.envs) parts.push(h("h2", null, "Summary"), summaryTable(summary));
        else parts.push(h("div", { class: "warnbox" }, "No summary.json: figures below are computed from the episodes."));
        if (doc.breakdown.length) parts.push(h("h2", null, "By env and task type"), breakdownTable(doc.breakdown));
        parts.push(h("h2", null, "Episodes"), filterBar(run.id, doc, rerender), episodeList(run.id, doc, rerender));
        if (proto) parts.push(h("h2", null, "Protocol"), h("details", null, h("summary", null, "The recorded protocol (env and policy versions, template, parser, limits, sampling, seeds)"), kvTable(proto)));
        return parts;
      }
      setMain.apply(null, view());
    });
  }

  // ------------------------------------------------------------------------------------------- episode
  function message(m) {
    var who = [m.role];
    if (m.name) who.push(m.name);
    var el = h("div", { class: "msg " + (["system", "user", "assistant", "tool"].indexOf(m.role) >= 0 ? m.role : "tool") },
      h("div", { class: "who" }, who.join(" · "), m.tool_call_id ? h("span", { class: "meta" }, "call " + m.tool_call_id) : null),
      h("div", { class: "body" }, m.content));
    (m.tool_calls || []).forEach(function (c) { el.appendChild(callBox(c)); });
    return el;
  }

  function callBox(c) {
    var args = String(c.arguments), inline = args.length <= 90 && args.indexOf("\n") < 0;
    if (!inline) { try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* not JSON: shown as it is */ } }
    return h("div", { class: "call" }, h("span", { class: "fn" }, "→ " + c.name), inline ? h("span", { class: "args" }, " " + args) : null,
      c.id ? h("span", { class: "muted small" }, "  " + c.id) : null, inline ? null : h("pre", null, args));
  }

  function turnView(t, i, diverge) {
    var meta = [];
    if (t.policy) meta.push(t.policy);
    if (t.prompt_tokens || t.completion_tokens) meta.push(t.prompt_tokens + " prompt + " + t.completion_tokens + " completion tokens");
    var tm = t.timing || {};
    if (isNum(tm.policy_s)) meta.push("policy " + secs(tm.policy_s));
    if (isNum(tm.env_s)) meta.push("env " + secs(tm.env_s));
    if (t.version !== null && t.version !== undefined) meta.push("weights v" + t.version);
    if (t.finish_reason && t.finish_reason !== "stop") meta.push("finish: " + t.finish_reason);
    var el = h("div", { class: "msg assistant" + (diverge ? " diverge" : ""), "data-turn": i },
      h("div", { class: "who" }, "assistant · turn " + (i + 1), h("span", { class: "meta" }, meta.join(" · ")),
        diverge ? badge("first difference", "warn", "the first turn whose action differs between the runs") : null,
        t.new_session && i > 0 ? badge("new session", "info", "the token context restarted here (a new training segment)") : null),
      h("div", { class: "body" }, t.text));
    (t.tool_calls || []).forEach(function (c) { el.appendChild(callBox(c)); });
    if (t.parse_error) el.appendChild(h("div", { class: "perr" }, "parse error: " + t.parse_error));
    if (isNum(t.reward) && t.reward !== 0) el.appendChild(h("div", { class: "reward" }, badge("reward " + num(t.reward), t.reward > 0 ? "ok" : "bad")));
    return [el].concat((t.observation || []).map(message));
  }

  function chat(ep, divergeAt) {
    var items = (ep.opening || []).map(message);
    (ep.turns || []).forEach(function (t, i) { items = items.concat(turnView(t, i, i === divergeAt)); });
    var end = [h("b", null, "End: "), outcomeBadges(ep), " reward " + num(ep.reward) + " · " + ep.turns.length + " turns · " +
      num(ep.gen_tokens) + " generated, " + num(ep.prompt_tokens) + " prompt tokens · " + secs(ep.wall_s)];
    items.push(h("div", { class: "end" }, end, ep.error ? h("div", { class: "errbox" }, ep.error) : null));
    return h("div", { class: "chat" }, items);
  }

  function renderEpisode(run, epId) {
    return load("run/" + run.id).then(function (doc) {
      return episodeDoc(run.id, epId, doc.chunk_size).then(function (ep) {
        crumbs(runCrumbs(run).concat([{ label: "episode " + epId }]));
        var list = filteredRows(run.id, doc).map(function (r) { return r.id; });
        var pos = list.indexOf(epId);
        var prev = pos > 0 ? list[pos - 1] : null, next = pos >= 0 && pos < list.length - 1 ? list[pos + 1] : null;
        var nav = h("div", { class: "nav" },
          h("a", { href: "#/run/" + run.id }, "← episodes"),
          prev !== null ? h("a", { href: "#/run/" + run.id + "/ep/" + prev }, "‹ previous") : null,
          next !== null ? h("a", { href: "#/run/" + run.id + "/ep/" + next }, "next ›") : null,
          pos >= 0 ? h("span", { class: "muted small" }, (pos + 1) + " of " + list.length + " in the list") : null);
        var sub = [short(ep.env), "type " + ep.type, "seed " + (ep.seed === null ? "–" : ep.seed), "sample " + (ep.sample === null ? "–" : ep.sample)];
        setMain(h("h1", null, ep.task), h("div", { class: "sub" }, sub.join(" · ")), h("div", null, outcomeBadges(ep)), nav, chat(ep),
          h("h2", null, "Details"),
          h("details", null, h("summary", null, "metrics, timing, info"), kvTable({ metrics: ep.metrics, timing: ep.timing, info: ep.info, policy_rewards: ep.policy_rewards })));
      });
    });
  }

  // ------------------------------------------------------------------------------------------- compare
  var STATUS_KIND = { gained: "ok", lost: "bad", changed: "warn", same: "info", partial: "info" };

  function cmpRows(doc, filter) {
    return doc.tasks.map(function (t, i) { return [t, i]; }).filter(function (x) {
      var t = x[0];
      if (filter.text && (t.env + " " + t.task).toLowerCase().indexOf(filter.text.toLowerCase()) < 0) return false;
      if (filter.status === "flipped") return t.status === "gained" || t.status === "lost" || t.status === "changed";
      if (filter.status === "episodes") return t.episode_flips > 0;
      if (filter.status && filter.status !== "all") return t.status === filter.status;
      return true;
    });
  }

  function renderCompare(ids) {
    var key = ids.join(",");
    return load("compare/" + key).then(function (doc) {
      crumbs([{ label: "compare" }, { label: doc.names.join(" → ") }]);
      var flipped = (doc.totals.status.gained || 0) + (doc.totals.status.lost || 0) + (doc.totals.status.changed || 0);
      var f = state.cmpFilter[key] = state.cmpFilter[key] || { status: flipped ? "flipped" : "all", text: "" };
      var here = location.hash;
      function rerender() { if (location.hash === here) setMain.apply(null, view()); }
      function view() {
        var runsTable = table(["run", { label: "episodes on shared tasks", num: 1 }, { label: "success [Wilson 95%]", num: 1 }],
          doc.totals.runs.map(function (r, j) {
            return h("tr", null, h("td", null, h("a", { href: "#/run/" + r.run }, doc.names[j])), h("td", { class: "num" }, num(r.episodes)),
              h("td", { class: "num" }, successCell(r.success, r.wilson95)));
          }));
        var st = doc.totals.status;
        var counts = ["gained", "lost", "changed", "same", "partial"].filter(function (s) { return st[s]; }).map(function (s) {
          return badge(st[s] + " " + s, STATUS_KIND[s]);
        });
        var options = [["flipped", "flipped tasks (gained, lost, changed)"], ["episodes", "any paired episode flipped"], ["all", "all tasks"],
          ["gained", "gained"], ["lost", "lost"], ["changed", "changed"], ["same", "same"], ["partial", "partial"]];
        var bar = h("div", { class: "filters" },
          h("label", null, "show", h("select", { "data-filter": "status", onchange: function (e) { f.status = e.target.value; rerender(); } },
            options.map(function (o) { var el = h("option", { value: o[0] }, o[1]); if (f.status === o[0]) el.selected = true; return el; }))),
          h("label", null, "task", h("input", { type: "text", value: f.text, placeholder: "task id contains", oninput: function (e) {
            f.text = e.target.value; var box = document.getElementById("cmplist"); box.replaceWith(list());
          } })));
        function list() {
          var rows = cmpRows(doc, f);
          return h("div", { id: "cmplist" }, h("div", { class: "count" }, rows.length + " of " + doc.tasks.length + " tasks"),
            table(["env", "task", "type"].concat(doc.names.map(function (n) { return { label: n, num: 1 }; })).concat(["status", { label: "episode flips", num: 1, title: "paired (seed, sample) episodes whose success differs between the first and last run" }]),
              rows.slice(0, 1000).map(function (x) {
                var t = x[0], i = x[1];
                return h("tr", { class: "click", "data-task": t.task, onclick: function () { location.hash = "#/compare/" + key + "/task/" + i; } },
                  h("td", null, short(t.env)), h("td", { class: "wrap" }, t.task), h("td", null, t.type),
                  t.runs.map(function (r) { return h("td", { class: "num" }, r.episodes ? r.successes + " / " + r.episodes : "–"); }),
                  h("td", null, badge(t.status, STATUS_KIND[t.status])), h("td", { class: "num" }, t.episode_flips));
              })));
        }
        return [h("h1", null, "Comparison"), h("div", { class: "sub" }, "Tasks are matched by env and task id; episodes by seed and sample. A task flipped when it was solved in one of the first and last runs and not in the other."),
          runsTable, h("div", { class: "nav" }, counts), bar, list()];
      }
      rerender();
    });
  }

  function renderCompareTask(ids, ti, pairIndex) {
    var key = ids.join(",");
    return load("compare/" + key).then(function (doc) {
      var t = doc.tasks[ti];
      if (!t) throw new Error("no task " + ti + " in this comparison");
      crumbs([{ label: "compare", href: "#/compare/" + key }, { label: doc.names.join(" → "), href: "#/compare/" + key }, { label: t.task }]);
      var pairs = t.pairs;
      var chosen = pairIndex;
      if (chosen === undefined || !pairs[chosen]) {
        chosen = 0;
        for (var i = 0; i < pairs.length; i++) if (differs(pairs[i])) { chosen = i; break; }
      }
      function differs(p) {
        var s = p.success || [];
        return s.every(function (x) { return x !== null; }) && s.some(function (x) { return x !== s[0]; });
      }
      return Promise.all(ids.map(function (rid) { return load("run/" + rid); })).then(function (runDocs) {
        var pair = pairs[chosen];
        return Promise.all(pair.eps.map(function (eid, j) { return eid === null ? null : episodeDoc(ids[j], eid, runDocs[j].chunk_size); }))
          .then(function (eps) {
            var picker = h("div", { class: "nav" }, h("span", { class: "muted small" }, "episode pair:"), pairs.map(function (p, i) {
              var label = "seed " + (p.seed === null ? "–" : p.seed) + (p.sample ? " · sample " + p.sample : "");
              return i === chosen ? h("b", null, label) : h("a", { href: "#/compare/" + key + "/task/" + ti + "/" + i }, label);
            }));
            var present = eps.filter(function (ep) { return ep; });
            var divergeAt = null;
            for (var k = 0; present.length > 1 && divergeAt === null; k++) {
              var texts = present.map(function (ep) { return ep.turns[k] ? ep.turns[k].text : null; });
              if (texts.every(function (x) { return x === null; })) break;
              if (texts.some(function (x) { return x !== texts[0]; })) divergeAt = k;
            }
            var cols = eps.map(function (ep, j) {
              return h("div", null, h("h3", null, h("a", { href: "#/run/" + ids[j] + (ep ? "/ep/" + ep.id : "") }, doc.names[j])),
                ep ? [h("div", null, outcomeBadges(ep)), chat(ep, divergeAt)] : h("p", { class: "muted" }, "no episode with this seed and sample"));
            });
            var side = h("div", { class: "side" }, cols);
            side.style.gridTemplateColumns = "repeat(" + cols.length + ", minmax(0, 1fr))";
            setMain(h("h1", null, t.task), h("div", { class: "sub" }, short(t.env) + " · type " + t.type + " · " +
              t.runs.map(function (r, j) { return doc.names[j] + ": " + r.successes + "/" + r.episodes; }).join(" · ")),
              h("div", null, badge(t.status, STATUS_KIND[t.status])), picker, side);
          });
      });
    });
  }

  // ------------------------------------------------------------------------------------------- charts
  var COLORS = ["#2f6feb", "#d1495b", "#1a7f37", "#9a6700", "#8250df", "#0b7285", "#6e7781", "#bc4c00"];

  function niceTicks(lo, hi, n) {
    if (lo === hi) { lo -= 1; hi += 1; }
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / n)));
    var err = span / n / step;
    if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toFixed(10));
    return out;
  }

  function fmtTick(v) {
    var a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100 || v === Math.round(v)) return String(Math.round(v));
    return String(+v.toPrecision(3));
  }

  /* spec: {title, series: [{name, pts: [[x, y]...]}], points: [{x, y, lo, hi, href, label}], percent} */
  function chart(spec) {
    var W = 340, H = 190, L = 44, R = 10, T = 8, B = 24;
    var xs = [], ys = [];
    spec.series.forEach(function (s) { s.pts.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    (spec.points || []).forEach(function (p) { xs.push(p.x); if (isNum(p.y)) ys.push(p.y); if (isNum(p.lo)) ys.push(p.lo); if (isNum(p.hi)) ys.push(p.hi); });
    var box = h("div", { class: "chart", "data-chart": spec.title });
    box.appendChild(h("div", { class: "ctitle" }, spec.title));
    if (!xs.length) { box.appendChild(h("div", { class: "muted small" }, "no data")); return box; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (spec.percent) { y0 = Math.min(0, y0); y1 = Math.max(1, y1); }
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    var pad = (y1 - y0) * 0.05; if (!spec.percent) { y0 -= pad; y1 += pad; }
    function X(v) { return L + (W - L - R) * (v - x0) / (x1 - x0); }
    function Y(v) { return T + (H - T - B) * (1 - (v - y0) / (y1 - y0)); }
    var g = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img" });
    g.appendChild(svg("title", {}, spec.title));
    niceTicks(y0, y1, 4).forEach(function (v) {
      if (v < y0 || v > y1) return;
      g.appendChild(svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }));
      g.appendChild(svg("text", { x: L - 4, y: Y(v) + 3, "text-anchor": "end" }, spec.percent ? Math.round(100 * v) + "%" : fmtTick(v)));
    });
    niceTicks(x0, x1, 5).forEach(function (v) {
      if (v < x0 || v > x1 || (x1 - x0 > 4 && v !== Math.round(v))) return;
      g.appendChild(svg("text", { x: X(v), y: H - 8, "text-anchor": "middle" }, fmtTick(v)));
    });
    g.appendChild(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    spec.series.forEach(function (s, i) {
      var color = COLORS[i % COLORS.length];
      if (!s.pts.length) return;
      g.appendChild(svg("polyline", { fill: "none", stroke: color, "stroke-width": 1.6,
        points: s.pts.map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ") }));
      if (s.pts.length <= 60) s.pts.forEach(function (p) {
        g.appendChild(svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.2, fill: color, class: "pt" }, svg("title", {}, s.name + " @ step " + p[0] + ": " + num(p[1]))));
      });
    });
    (spec.points || []).forEach(function (p) {
      if (!isNum(p.y)) return;
      var grp = svg("g", {});
      if (isNum(p.lo) && isNum(p.hi)) {
        grp.appendChild(svg("line", { x1: X(p.x), x2: X(p.x), y1: Y(p.lo), y2: Y(p.hi), stroke: "#d1495b", "stroke-width": 1.4 }));
        [p.lo, p.hi].forEach(function (v) { grp.appendChild(svg("line", { x1: X(p.x) - 4, x2: X(p.x) + 4, y1: Y(v), y2: Y(v), stroke: "#d1495b", "stroke-width": 1.4 })); });
      }
      grp.appendChild(svg("circle", { cx: X(p.x), cy: Y(p.y), r: 4, fill: "#d1495b", class: "pt" }, svg("title", {}, p.label)));
      if (p.href) {
        var a = svg("a", { href: safeHref(p.href), "data-stage": p.stage || "" });
        a.appendChild(grp);
        g.appendChild(a);
      } else g.appendChild(grp);
    });
    box.appendChild(g);
    if (spec.series.length > 1 || (spec.series.length === 1 && spec.series[0].name !== spec.title)) {
      box.appendChild(h("div", { class: "legend" }, spec.series.map(function (s, i) {
        var sw = h("i"); sw.style.background = COLORS[i % COLORS.length];
        return h("span", null, sw, s.name);
      })));
    }
    return box;
  }

  var PANELS = [
    ["reward", /(^|\/)reward_mean$/],
    ["rollout success", /(^|\/)success_rate$/],
    ["loss", /(^|\/)loss$/],
    ["KL", /(^|\/)kl[^/]*$/i],
    ["clip fraction", /clip/i],
    ["entropy", /entropy/i],
    ["tokens/s", /tokens_per_s$/],
    ["memory (GB)", /^mem\//],
    ["staleness", /stale/i]
  ];

  function seriesPts(metrics, key) {
    var steps = metrics.steps, vals = metrics.series[key] || [], pts = [];
    for (var i = 0; i < steps.length; i++) if (isNum(vals[i])) pts.push([steps[i], vals[i]]);
    return pts;
  }

  // ------------------------------------------------------------------------------------------- training run
  function renderTrain(run) {
    return load("run/" + run.id).then(function (doc) {
      crumbs(runCrumbs(run));
      var res = doc.result || {};
      var cfg = doc.config || {};
      var metrics = doc.metrics;
      var keys = Object.keys(metrics.series);
      var here = location.hash;
      function rerender() { if (location.hash !== here) return; var y = window.scrollY; var main = document.getElementById("main"); main.replaceChildren.apply(main, view()); window.scrollTo(0, y); }
      function view() {
        var sub = [run.path];
        if (cfg.run && cfg.run.algorithm) sub.push(cfg.run.algorithm);
        if (cfg.model && cfg.model.path) sub.push("model " + cfg.model.path);
        if (cfg.rollout && cfg.rollout.env) sub.push(cfg.rollout.env);
        if (isNum(res.steps)) sub.push(res.steps + " steps");
        if (isNum(res.train_wall_s)) sub.push(secs(res.train_wall_s) + " of training");
        var parts = [h("h1", null, run.name), h("div", { class: "sub" }, sub.join(" · "))];
        if (res.interrupted_at_step) parts.push(h("div", { class: "warnbox" }, "Interrupted at step " + res.interrupted_at_step + "."));
        if (res.stopped_by_time_budget_at_step) parts.push(h("div", { class: "warnbox" }, "Stopped by its time budget at step " + res.stopped_by_time_budget_at_step + "."));
        if (metrics.skipped) parts.push(h("div", { class: "warnbox" }, metrics.skipped + " line(s) of metrics.jsonl could not be read and are left out."));
        // held-out
        var held = doc.heldout;
        if (held.length) {
          parts.push(h("h2", null, "Held-out evals"));
          var first = held[0];
          parts.push(table(["stage", { label: "step", num: 1 }, { label: "success [95%]", num: 1 }, { label: "episodes", num: 1 }, "interval", ""],
            held.map(function (p) {
              return h("tr", { class: "click", "data-stage": p.stage, onclick: function () { location.hash = "#/run/" + p.run; } },
                h("td", null, h("a", { href: "#/run/" + p.run }, p.stage)), h("td", { class: "num" }, num(p.step)),
                h("td", { class: "num" }, successCell(p.success, p.ci95)), h("td", { class: "num" }, num(p.episodes)),
                h("td", { class: "muted small" }, p.interval || ""),
                h("td", null, p.run !== first.run ? h("a", { href: "#/compare/" + first.run + "," + p.run, onclick: function (e) { e.stopPropagation(); } }, "compare with " + first.stage) : ""));
            })));
        }
        // curves
        var charts = [];
        if (held.length) charts.push(chart({ title: "held-out success", series: [], percent: true, points: held.filter(function (p) { return isNum(p.step); }).map(function (p) {
          return { x: p.step, y: p.success, lo: p.ci95 ? p.ci95[0] : null, hi: p.ci95 ? p.ci95[1] : null, href: "#/run/" + p.run, stage: p.stage,
            label: p.stage + ": " + pct(p.success) + (p.ci95 ? " " + ciText(p.ci95) : "") + " (open its episodes)" };
        }) }));
        var used = {};
        PANELS.forEach(function (pn) {
          var ks = keys.filter(function (k) { return pn[1].test(k) && !used[k]; });
          if (!ks.length) return;
          ks.forEach(function (k) { used[k] = 1; });
          charts.push(chart({ title: pn[0], series: ks.map(function (k) { return { name: k, pts: seriesPts(metrics, k) }; }),
            percent: pn[0] === "rollout success" }));
        });
        (state.extra[run.id] || []).forEach(function (k) { charts.push(chart({ title: k, series: [{ name: k, pts: seriesPts(metrics, k) }] })); });
        parts.push(h("h2", null, "Curves"));
        if (!keys.length) parts.push(h("p", { class: "muted" }, "No metrics.jsonl records yet."));
        else {
          var others = keys.filter(function (k) { return (state.extra[run.id] || []).indexOf(k) < 0; }).sort();
          parts.push(h("div", { class: "filters" }, h("span", { class: "muted small" }, metrics.records + " records in metrics.jsonl; x: step as logged"),
            h("label", null, "add a curve", h("select", { onchange: function (e) { if (!e.target.value) return; (state.extra[run.id] = state.extra[run.id] || []).push(e.target.value); rerender(); } },
              [h("option", { value: "" }, "—")].concat(others.map(function (k) { return h("option", { value: k }, k); }))))));
        }
        parts.push(h("div", { class: "charts" }, charts));
        // groups
        if (doc.groups) parts.push(h("h2", null, "Rollout groups"), groupFilters(run.id, doc, rerender), groupList(run.id, doc));
        else parts.push(h("h2", null, "Rollout groups"), h("p", { class: "muted small" }, "No groups.jsonl: set [log] groups = true in the training config to record every rollout group (members' actions, rewards, gate decisions)."));
        if (doc.result) parts.push(h("details", null, h("summary", null, "result.json"), kvTable(doc.result)));
        if (doc.config) parts.push(h("details", null, h("summary", null, "config.json"), kvTable(doc.config)));
        return parts;
      }
      setMain.apply(null, view());
    });
  }

  function groupMatches(g, f) {
    if (f.outcome === "kept" && g.outcome !== "kept") return false;
    if (f.outcome === "filtered" && g.outcome === "kept") return false;
    if (!tri(f.zero, g.zero_variance)) return false;
    if (!tri(f.stopped, g.early_stopped)) return false;
    if (!tri(f.gate, g.gate_stops > 0)) return false;
    if (f.task && String(g.task).toLowerCase().indexOf(f.task.toLowerCase()) < 0) return false;
    return true;
  }

  function groupFilters(runId, doc, rerender) {
    var f = state.gfilters[runId] = state.gfilters[runId] || {};
    function sel(label, key, options) {
      return h("label", null, label, h("select", { "data-gfilter": key, onchange: function (e) { f[key] = e.target.value; rerender(); } },
        options.map(function (o) { var el = h("option", { value: o[0] }, o[1]); if ((f[key] || "") === o[0]) el.selected = true; return el; })));
    }
    var yn = [["", "any"], ["yes", "yes"], ["no", "no"]];
    return h("div", { class: "filters" },
      sel("outcome", "outcome", [["", "any"], ["kept", "kept"], ["filtered", "filtered"]]),
      sel("zero variance", "zero", yn), sel("early-stopped", "stopped", yn), sel("gate stop", "gate", yn),
      h("label", null, "task", h("input", { type: "text", value: f.task || "", size: 12, oninput: function (e) {
        f.task = e.target.value; var box = document.getElementById("glist"); box.replaceWith(groupList(runId, doc));
      } })));
  }

  function groupList(runId, doc) {
    var f = state.gfilters[runId] || {};
    var rows = rowsOfDoc(doc, "group_table").filter(function (g) { return groupMatches(g, f); });
    var limit = state.glimit[runId] || 100;
    return h("div", { id: "glist" }, h("div", { class: "count" }, rows.length + " of " + doc.groups + " groups"),
      table([{ label: "#", num: 1 }, { label: "step", num: 1 }, "task", { label: "members", num: 1 }, { label: "reward mean", num: 1 },
        { label: "successes", num: 1 }, "", "outcome", "gate", { label: "tokens", num: 1 }],
        rows.slice(0, limit).map(function (g) {
          var tags = [];
          if (g.zero_variance) tags.push(badge("zero variance", "info"));
          if (g.early_stopped) tags.push(badge("early-stopped", "warn", g.stop_reason));
          return h("tr", { class: "click", "data-group": g.id, onclick: function () { location.hash = "#/run/" + runId + "/group/" + g.id; } },
            h("td", { class: "num" }, g.id), h("td", { class: "num" }, num(g.step)), h("td", { class: "wrap" }, g.task),
            h("td", { class: "num" }, g.members), h("td", { class: "num" }, num(g.reward_mean)), h("td", { class: "num" }, g.successes + " / " + g.members),
            h("td", null, tags), h("td", null, g.outcome),
            h("td", null, g.gate_decisions ? (g.gate_stops ? (g.gate_enforced ? "stopped" : "would stop (audit)") : "continued") +
              " (" + g.gate_decisions + (g.gate_decisions === 1 ? " decision)" : " decisions)") : "–"),
            h("td", { class: "num" }, num(g.tokens)));
        })),
      rows.length > limit ? h("div", { class: "more" }, h("button", { onclick: function () {
        state.glimit[runId] = limit + 100; document.getElementById("glist").replaceWith(groupList(runId, doc));
      } }, "Show " + Math.min(100, rows.length - limit) + " more")) : null);
  }

  /* a canonical tool call ({"arguments": {...}, "name": ...}, as groups.jsonl logs it) as name(arguments) */
  function callText(a) {
    try {
      var c = JSON.parse(a);
      if (c && typeof c.name === "string" && c.arguments && typeof c.arguments === "object") {
        var args = Object.keys(c.arguments).map(function (k) { return k + "=" + JSON.stringify(c.arguments[k]); });
        return c.name + "(" + args.join(", ") + ")";
      }
    } catch (e) { /* a plain-text action */ }
    return a;
  }

  function renderGroup(run, gid) {
    return load("run/" + run.id).then(function (doc) {
      return load("run/" + run.id + "/gchunk/" + chunkOf(gid, doc.chunk_size)).then(function (c) {
        var g = c.groups[gid - chunkOf(gid, doc.chunk_size) * doc.chunk_size];
        if (!g || g.id !== gid) throw new Error("no group " + gid + " in run " + run.id);
        crumbs(runCrumbs(run).concat([{ label: "group " + gid }]));
        var members = g.member_records;
        var stops = g.gate_records.filter(function (r) { return r.action === "stop"; });
        var stopStep = stops.length ? Math.min.apply(null, stops.map(function (r) { return isNum(r.step) ? r.step : Infinity; })) : null;
        var steps = Math.max.apply(null, [0].concat(members.map(function (m) { return Math.max(m.actions.length, m.calls.length); })));
        var rows = [];
        for (var s = 0; s < steps; s++) {
          var first = members.length ? (members[0].calls[s] || members[0].actions[s]) : null;
          rows.push(h("tr", null, h("td", { class: "num" }, s + 1), members.map(function (m) {
            var a = m.calls[s] || m.actions[s];
            if (a === undefined) return h("td", { class: "muted" }, "—");
            return h("td", { class: a === first && members.length > 1 ? "same" : null, title: a }, h("pre", null, callText(a)),
              isNum(m.turn_tokens[s]) ? h("div", { class: "muted small" }, m.turn_tokens[s] + " tokens") : null);
          })));
          if (stopStep !== null && s + 1 === stopStep) {
            rows.push(h("tr", { class: "gate" }, h("td", { colspan: members.length + 1 },
              stops.map(function (r) {
                return (r.enforced ? "gate " + r.gate + " stopped the group here" : "gate " + r.gate + " would stop here (audit)") + ": " + r.reason +
                  (isNum(r.score) ? " (score " + num(r.score) + ")" : "");
              }).join("; "))));
          }
        }
        rows.push(h("tr", null, h("td", null, h("b", null, "end")), members.map(function (m) {
          return h("td", null, m.success ? badge("success", "ok") : badge("fail", "bad"), " reward " + num(m.reward),
            m.truncated ? badge("truncated", "warn") : null, m.error ? h("div", { class: "errbox" }, m.error) : null);
        })));
        var grid = table([{ label: "step", num: 1 }].concat(members.map(function (m) { return "member " + m.member; })), rows);
        grid.querySelector("table").classList.add("grid");
        var gates = g.gate_records.length ? table(["gate", "decision", { label: "at step", num: 1 }, { label: "score", num: 1 }, "reason", "mode",
          { label: "tokens at decision", num: 1 }, "final zero variance", { label: "final tokens", num: 1 }],
          g.gate_records.map(function (r) {
            return h("tr", null, h("td", null, r.gate), h("td", null, r.action === "stop" ? badge("stop", "warn") : String(r.action)),
              h("td", { class: "num" }, num(r.step)), h("td", { class: "num" }, num(r.score)), h("td", { class: "wrap" }, r.reason),
              h("td", null, r.enforced ? "enforced" : "audit"), h("td", { class: "num" }, num(r.tokens_at_decision)),
              h("td", null, r.final_zero_variance === null || r.final_zero_variance === undefined ? "–" : String(r.final_zero_variance)),
              h("td", { class: "num" }, num(r.final_tokens)));
          })) : h("p", { class: "muted small" }, "No gate decisions were recorded for this group.");
        setMain(h("h1", null, "Group " + gid + ": " + g.task), h("div", { class: "sub" }, [short(g.env), "step " + num(g.step), "weights v" + num(g.version), g.group].join(" · ")),
          h("div", null, g.zero_variance ? badge("zero variance", "info") : null, g.early_stopped ? badge("early-stopped: " + (g.stop_reason || ""), "warn") : null,
            badge(g.outcome, g.outcome === "kept" ? "ok" : "warn")),
          h("div", { class: "nav" }, h("a", { href: "#/run/" + run.id }, "← training run")),
          h("h2", null, "Gate decisions"), gates, h("h2", null, "Members' actions, step by step"), grid);
      });
    });
  }

  // ------------------------------------------------------------------------------------------- router
  function route() {
    var parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
    var hash = "#/" + parts.slice(0, 2).join("/");
    sidebar(hash);
    var p;
    status("");
    try {
      if (!parts.length) { renderOverview(); return; }
      if (parts[0] === "run" && /^\d+$/.test(parts[1] || "")) {
        var run = runInfo(+parts[1]);
        if (!run) throw new Error("no run " + parts[1]);
        if (parts[2] === "ep" && /^\d+$/.test(parts[3] || "")) p = renderEpisode(run, +parts[3]);
        else if (parts[2] === "group" && /^\d+$/.test(parts[3] || "")) p = renderGroup(run, +parts[3]);
        else p = run.kind === "train" ? renderTrain(run) : renderEval(run);
      } else if (parts[0] === "compare" && /^\d+(,\d+)+$/.test(parts[1] || "")) {
        var ids = parts[1].split(",").map(Number);
        if (parts[2] === "task" && /^\d+$/.test(parts[3] || "")) p = renderCompareTask(ids, +parts[3], parts[4] !== undefined ? +parts[4] : undefined);
        else p = renderCompare(ids);
      } else throw new Error("no page " + location.hash);
    } catch (e) { showError(e); return; }
    if (p) {
      status("loading…");
      p.then(function () { if (document.getElementById("status").textContent === "loading…") status(""); }, showError);
    }
  }

  function start() {
    load("index").then(function (idx) {
      state.index = idx;
      window.addEventListener("hashchange", route);
      route();
    }, showError);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
