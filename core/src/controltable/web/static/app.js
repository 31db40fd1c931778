// The controltable status page: polls api/status and redraws. Our own code, no libraries, no network
// beyond this server. Every value from the database is put in the page as text (never as HTML).
"use strict";
(function () {
  const body = document.body;
  const pollMs = Math.max(500, parseInt(body.dataset.pollMs || "2000", 10));
  const actions = body.dataset.actions === "true";
  const SVG = "http://www.w3.org/2000/svg";
  let chartsAt = 0;          // when the chart series were last fetched (they change slowly)
  let lastStats = null;

  // -- small DOM helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, String(v));
      else if (k === "title") node.title = String(v);
      else if (k === "style") node.style.cssText = v;  // CSSOM: allowed by the page's CSP, unlike the attribute
      else if (k === "onclick") node.addEventListener("click", v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }
  const dash = "-";
  function show(v) { return v === null || v === undefined ? dash : String(v); }
  function dur(s) {
    if (s === null || s === undefined) return dash;
    const a = Math.abs(s);
    let t;
    if (a < 1) t = a.toFixed(2) + " s";
    else if (a < 90) t = a.toFixed(a < 10 ? 1 : 0) + " s";
    else if (a < 5400) t = (a / 60).toFixed(1) + " min";
    else if (a < 172800) t = (a / 3600).toFixed(1) + " h";
    else t = (a / 86400).toFixed(1) + " d";
    return s < 0 ? "-" + t : t;
  }
  function pctText(u) {
    if (u === null || u === undefined) return dash;
    return (u > 0 && u < 0.1 ? (u * 100).toFixed(1) : Math.round(u * 100)) + "%";
  }
  function clock(epoch) {
    if (epoch === null || epoch === undefined) return dash;
    return new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }
  function lease(e) {
    if (e.expires_in === null || e.expires_in === undefined) return dash;
    return e.expires_in >= 0 ? "in " + dur(e.expires_in) : "expired " + dur(-e.expires_in) + " ago";
  }

  // -- actions (only when the server enables them; each needs the token) ----------------------------
  async function act(path, payload) {
    const token = document.getElementById("token").value;
    sessionStorage.setItem("ct-token", token);
    // Actions take the token only as a Bearer header: the browser's own login (HTTP Basic) is refused
    // there, since a browser would attach it to another site's forged form as well.
    if (!token) { alert("type the action token into the 'action token' field first"); return; }
    const headers = {"Content-Type": "application/json"};
    headers["Authorization"] = "Bearer " + token;
    const resp = await fetch(path, {method: "POST", headers: headers, body: JSON.stringify(payload)});
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) alert(data.error || resp.statusText); else refresh(true);
  }

  // -- charts ----------------------------------------------------------------------------------------
  function waitChart(points, label) {
    const W = 250, H = 90, L = 34, B = 14;
    const s = svg("svg", {class: "chart wait", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-window": label,
      role: "img", "aria-label": `wait p50 and p95, last ${label}`});
    const vals = points.flatMap(p => [p.wait_p50, p.wait_p95]).filter(v => v !== null && v !== undefined);
    const max = Math.max(0.001, ...vals);
    const n = points.length;
    const x = i => L + (n <= 1 ? 0 : i * (W - L - 4) / (n - 1));
    const y = v => (H - B) - (v / max) * (H - B - 6);
    s.append(svg("line", {class: "axis", x1: L, y1: H - B, x2: W - 4, y2: H - B}));
    s.append(svg("line", {class: "axis", x1: L, y1: 4, x2: L, y2: H - B}));
    const top = svg("text", {x: 2, y: 12}); top.textContent = dur(max); s.append(top);
    const zero = svg("text", {x: 2, y: H - B}); zero.textContent = "0"; s.append(zero);
    const span = svg("text", {x: L, y: H - 2}); span.textContent = `last ${label}`; s.append(span);
    for (const key of ["wait_p50", "wait_p95"]) {
      const cls = key === "wait_p50" ? "p50" : "p95";
      let d = "";
      const dots = [];
      points.forEach((p, i) => {
        const v = p[key];
        if (v === null || v === undefined) return;  // no grants in that bucket: a gap, not a zero
        d += (d ? "L" : "M") + x(i).toFixed(1) + "," + y(v).toFixed(1);
        const c = svg("circle", {class: cls + " dot", cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5});
        const t = svg("title", {}); t.textContent = `${cls} ${dur(v)}, ${show(p.grants)} grants`;
        c.append(t); dots.push(c);
      });
      if (d) s.append(svg("path", {class: cls, d}));
      s.append(...dots);
    }
    return s;
  }
  function utilChart(points, label) {
    const W = 250, H = 90, L = 34, B = 14;
    const s = svg("svg", {class: "chart util", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-window": label,
      role: "img", "aria-label": `utilisation, last ${label}`});
    const n = Math.max(1, points.length);
    const bw = (W - L - 4) / n;
    s.append(svg("line", {class: "axis", x1: L, y1: H - B, x2: W - 4, y2: H - B}));
    const top = svg("text", {x: 2, y: 12}); top.textContent = "100%"; s.append(top);
    const span = svg("text", {x: L, y: H - 2}); span.textContent = `last ${label}`; s.append(span);
    points.forEach((p, i) => {
      const u = Math.max(0, Math.min(1, p.utilisation || 0));
      const h = u * (H - B - 6);
      const r = svg("rect", {class: "util", x: (L + i * bw + 1).toFixed(1), y: (H - B - h).toFixed(1),
        width: Math.max(1, bw - 2).toFixed(1), height: h.toFixed(1)});
      const t = svg("title", {}); t.textContent = `${Math.round(u * 100)}%, ${show(p.grants)} grants`;
      r.append(t); s.append(r);
    });
    return s;
  }
  function charts(name, stats) {
    if (!stats || !stats.available || !stats.series || !stats.series[name]) return null;
    const box = el("div", {class: "charts", "data-resource": name});
    for (const [label, points] of Object.entries(stats.series[name])) {
      box.append(el("div", {class: "chart-box"},
        el("div", {}, "wait ", el("span", {class: "legend-p50"}, "p50"), " / ", el("span", {class: "legend-p95"}, "p95")),
        waitChart(points, label)));
      box.append(el("div", {class: "chart-box"}, el("div", {}, "utilisation"), utilChart(points, label)));
    }
    return box;
  }

  // -- sections --------------------------------------------------------------------------------------
  function idleLine(idle) {
    if (!idle.length) return null;
    const names = [];
    idle.forEach((r, i) => {
      if (i) names.push(", ");
      names.push(el("span", {class: "idle-resource", "data-resource": r.name,
        title: `capacity ${r.capacity}` + (r.rate ? `, rate limit ${r.rate.text}` : "")}, r.name));
    });
    return el("p", {class: "muted idle", "data-idle": idle.length},
      `idle (nothing held or waiting, no grant in the last hour): `, ...names);
  }

  function resourceCard(r, stats) {
    const pct = r.capacity ? Math.min(100, 100 * r.used / r.capacity) : 0;
    const cur = stats && stats.current ? stats.current[r.name] : null;
    const card = el("section", {class: "card resource", "data-resource": r.name},
      el("h3", {},
        el("span", {class: "name"}, r.name),
        el("span", {class: "meter" + (r.used >= r.capacity ? " full" : ""), title: `${r.used} of ${r.capacity}`},
          el("span", {style: `width:${pct}%`})),
        el("span", {class: "used", "data-used": r.used}, `${r.used} / ${r.capacity} used`),
        r.rate ? el("span", {class: "muted rate"}, "rate limit ", r.rate.text) : null,  // only what is set
        r.rate_opens_in ? el("span", {class: "blocker"}, `rate limit reached: next grant in ${dur(r.rate_opens_in)}`) : null,
        r.aging ? el("span", {class: "muted"}, `aging +1 priority per ${dur(r.aging)}`) : null,
        el("span", {class: "muted"}, `${r.waiters.length} waiting`),
        actions ? el("button", {onclick: () => {
          const v = prompt(`new capacity of ${r.name}`, String(r.capacity));
          if (v) act("api/capacity", {resource: r.name, capacity: parseInt(v, 10)});
        }}, "capacity…") : null));
    if (cur) card.append(el("div", {class: "muted last-hour"}, `last hour: ${show(cur.grants)} grants, wait p50 `
      + `${dur(cur.wait_p50)}, p95 ${dur(cur.wait_p95)}, max ${dur(cur.wait_max)}, ${pctText(cur.utilisation)} used, `
      + `${show(cur.expired)} lease expiries`));
    if (r.holders.length) {
      const t = el("table", {class: "holders"}, el("tr", {},
        ["holder", "mode", "slots", "token", "since", "lease"].map(h => el("th", {class: ["slots", "token"].includes(h) ? "num" : ""}, h)),
        actions ? el("th", {}) : null));
      for (const h of r.holders) {
        t.append(el("tr", {class: "holder" + (h.expired ? " expired" : ""), "data-holder": h.holder},
          el("td", {}, h.holder), el("td", {}, h.mode), el("td", {class: "num"}, h.slots),
          el("td", {class: "num"}, show(h.token)), el("td", {title: clock(h.since)}, h.age === null ? dash : dur(h.age) + " ago"),
          el("td", {title: clock(h.expires_at)}, lease(h)),
          actions ? el("td", {}, el("button", {onclick: () => {
            if (confirm(`release ${h.holder} on ${r.name}?`)) act("api/release", {resource: r.name, holder: h.holder});
          }}, "release")) : null));
      }
      card.append(t);
    } else {
      card.append(el("p", {class: "muted idle"}, "no holders"));
    }
    if (r.waiters.length) {
      const t = el("table", {class: "waiters"}, el("tr", {},
        ["#", "waiter", "mode", "slots", "priority", "waiting", "behind"].map(h => el("th", {class: ["#", "slots", "priority"].includes(h) ? "num" : ""}, h))));
      for (const w of r.waiters) {
        const eff = w.effective_priority;
        const prio = w.priority === null ? dash : (eff !== null && Math.abs(eff - w.priority) >= 0.05
          ? `${w.priority} (aged → ${Number.isInteger(eff) ? eff : eff.toFixed(1)})` : String(w.priority));
        const ahead = w.ahead || [];
        t.append(el("tr", {class: "waiter", "data-holder": w.holder, "data-position": w.position},
          el("td", {class: "num"}, w.position), el("td", {}, w.holder), el("td", {}, w.mode),
          el("td", {class: "num"}, w.slots), el("td", {class: "num"}, prio),
          el("td", {title: clock(w.since)}, w.age === null ? dash : dur(w.age)),
          el("td", {class: "muted", title: ahead.join(", ")}, ahead.length > 3
            ? ahead.slice(0, 3).join(", ") + ` and ${ahead.length - 3} more` : (ahead.join(", ") || dash))));
      }
      card.append(t);
    }
    const c = charts(r.name, stats);
    if (c) card.append(c);
    return card;
  }

  function eventCard(e) {
    if (e.problem) return el("section", {class: "card event", "data-table": e.table}, el("h3", {}, e.table),
      el("p", {class: "problem"}, e.problem));
    const rate = v => v === null || v === undefined ? dash : v.toFixed(1) + "/min";
    const card = el("section", {class: "card event", "data-table": e.table},
      el("h3", {}, el("span", {class: "name"}, e.table),
        el("span", {class: "muted"}, `oldest pending: ${e.oldest_pending_age === null ? (e.oldest_pending_key === null ? dash : "key " + e.oldest_pending_key) : dur(e.oldest_pending_age)}`),
        el("span", {class: "muted"}, `claims ${rate(e.claims_per_minute)}, completions ${rate(e.completions_per_minute)}`)),
      el("table", {class: "states"},
        el("tr", {}, ["pending", "claimed", "(expired)", "done", "error", "total"].map(h => el("th", {class: "num"}, h))),
        el("tr", {}, ["pending", "claimed", "expired", "done", "error", "total"].map(k => el("td", {class: "num", "data-state": k}, e[k])))));
    if (e.errors && e.errors.length) {
      card.append(el("table", {class: "errors"}, el("tr", {}, el("th", {}, "key"), el("th", {class: "num"}, "attempts"), el("th", {}, "last error")),
        e.errors.map(x => el("tr", {class: "error-row"}, el("td", {}, show(x.key)), el("td", {class: "num"}, x.attempts), el("td", {}, show(x.error))))));
    }
    return card;
  }

  function worklistCard(w) {
    if (w.problem) return el("section", {class: "card worklist", "data-worklist": w.name}, el("h3", {}, w.name),
      el("p", {class: "problem"}, w.problem));
    const pct = w.total ? 100 * w.done / w.total : 0;
    const card = el("section", {class: "card worklist", "data-worklist": w.name},
      el("h3", {}, el("span", {class: "name"}, w.name),
        el("span", {class: "progress"}, el("span", {style: `width:${pct}%`})),
        el("span", {}, `${w.done} / ${w.total} done`),
        el("span", {class: "muted"}, w.finished ? "finished" : `working on order ${w.current_order}`)));
    if (w.blocker) card.append(el("p", {class: "blocker"}, w.blocker));
    card.append(el("table", {class: "orders"},
      el("tr", {}, ["order", "new", "active", "done", "error", "progress"].map(h => el("th", {class: h === "progress" ? "" : "num"}, h))),
      w.orders.map(o => {
        const n = o.new + o.active + o.done + o.error;
        return el("tr", {"data-order": o.order}, el("td", {class: "num"}, o.order), el("td", {class: "num"}, o.new),
          el("td", {class: "num"}, o.active), el("td", {class: "num"}, o.done), el("td", {class: "num"}, o.error),
          el("td", {}, el("span", {class: "progress"}, el("span", {style: `width:${n ? 100 * o.done / n : 0}%`}))));
      })));
    if (w.errors.length) {
      card.append(el("table", {class: "errors"}, el("tr", {}, el("th", {}, "item"), el("th", {}, "order"), el("th", {}, "last error")),
        w.errors.map(x => el("tr", {class: "error-row"}, el("td", {}, "#" + x.id), el("td", {}, x.order), el("td", {}, show(x.error))))));
    }
    return card;
  }

  // The findings of `controltable doctor` (refreshed by the server every minute) and the push state.
  function renderDoctor(data) {
    const push = data.push;
    document.getElementById("push").textContent = !push ? "" : push.active
      ? `push wake-ups active${push.round_trip_ms === null ? "" : " (probe " + push.round_trip_ms.toFixed(1) + " ms)"}`
      : `push wake-ups ${push.state}: ${push.detail}`;
    const rows = data.doctor || [];
    document.getElementById("doctor").replaceChildren(
      el("tr", {}, el("th", {}, "check"), el("th", {}, "level"), el("th", {}, "finding"), el("th", {}, "fix")),
      ...rows.map(f => el("tr", {class: "finding " + f.level, "data-check": f.check},
        el("td", {}, f.check), el("td", {class: "level"}, f.level), el("td", {}, f.message),
        el("td", {}, f.fix === "nothing to do" ? "" : f.fix))));
  }

  // -- the loop --------------------------------------------------------------------------------------
  function render(data) {
    document.getElementById("where").textContent = `namespace ${data.namespace} · ${data.database}`;
    if (data.stats && data.stats.series) lastStats = data.stats;
    const stats = lastStats;
    const note = document.getElementById("chart-note");
    if (data.stats && data.stats.note) { note.hidden = false; note.textContent = data.stats.note; }
    else if (data.stats && data.stats.series) note.hidden = true;  // a refresh without charts leaves it as it is
    // Active resources (holders, waiters, or grants in the last hour) get cards, in the server's
    // order; idle ones fold into one line, so a busy resource never hides behind empty cards.
    const res = document.getElementById("resources");
    const active = data.resources.filter(r => r.active !== false);
    const idle = data.resources.filter(r => r.active === false);
    res.replaceChildren(...(data.resources.length ? [...active.map(r => resourceCard(r, stats)), idleLine(idle)].filter(Boolean)
      : [el("p", {class: "muted"}, "no resources in this namespace; create one with `controltable capacity set NAME N`")]));
    document.getElementById("events-title").hidden = !data.events.length;
    document.getElementById("events").replaceChildren(...data.events.map(eventCard));
    document.getElementById("worklists-title").hidden = !data.worklists.length;
    document.getElementById("worklists").replaceChildren(...data.worklists.map(worklistCard));
    renderDoctor(data);
    document.getElementById("updated").textContent = "updated " + clock(data.now);
    body.dataset.updated = String(data.now);
  }

  async function refresh(force) {
    const live = document.getElementById("live");
    const problem = document.getElementById("problem");
    const wantCharts = force || Date.now() - chartsAt > 30000;
    try {
      const resp = await fetch("api/status" + (wantCharts ? "" : "?charts=0"), {cache: "no-store"});
      const data = await resp.json();
      if (!resp.ok) throw new Error(data.error || resp.statusText);
      if (wantCharts) chartsAt = Date.now();
      render(data);
      problem.hidden = true; live.className = "dot on";
    } catch (err) {
      problem.hidden = false; problem.textContent = "cannot read the control table: " + err.message;
      live.className = "dot off";
    }
  }

  if (actions) {
    document.getElementById("actionbar").hidden = false;
    document.getElementById("token").value = sessionStorage.getItem("ct-token") || "";
  }
  refresh(true);
  setInterval(() => refresh(false), pollMs);
})();
