// gradscope's HTML viewer: lays out the visible part of the graph with dagre (vendored, see
// README.md here) and draws it as SVG. State: the set of expanded module paths; a node inside a
// collapsed module is drawn as that module's box.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("gs-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const byId = new Map(D.nodes.map((n) => [n.id, n]));
  const mods = D.modules;
  const expanded = new Set(D.expanded);
  const svg = document.getElementById("graph");
  const viewport = document.getElementById("viewport");
  const details = document.getElementById("details");
  const results = document.getElementById("results");
  const search = document.getElementById("search");
  const status = document.getElementById("status");
  const COLORS = {
    op: "#d3d3d3", accumulate: "#d3d3d3", custom: "#ffbbff", leaf: "#add8e6",
    output: "#caff70", module: "#ffffe0", folded: "#ffec8b", base: "#a2cd5a",
  };
  let view = { x: 0, y: 0, k: 1 };
  let layoutSize = { width: 1, height: 1 };
  let selected = null;
  const chains = new Map();

  // ------------------------------------------------------------------ visible graph
  function chainOf(key) {
    const out = [];
    while (key) { out.push(key); key = mods[key].parent; }
    return out.reverse();
  }
  function rep(node) { // [visible id, cluster it is drawn in]
    let chain = chains.get(node.id);
    if (!chain) { chain = chainOf(node.key); chains.set(node.id, chain); }
    for (const key of chain) if (!expanded.has(key)) return ["box:" + key, mods[key].parent];
    return [node.id, node.key];
  }
  function fmtBytes(n) {
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let i = -1;
    do { n /= 1024; i++; } while (n >= 1024 && i < units.length - 1);
    return n.toFixed(1) + " " + units[i];
  }
  function shape(s) { return s ? "(" + s.join(", ") + ")" : "(?)"; }
  function labelOf(v) {
    if (v.key) {
      const m = mods[v.key];
      return [v.key, (m.cls ? m.cls + " · " : "") + m.nodes + " nodes", "saved " + fmtBytes(m.bytes)];
    }
    const n = v.node;
    if (n.kind === "leaf" || n.kind === "output") return [n.name || n.kind, n.tensor ? shape(n.tensor.shape) : ""];
    if (n.kind === "module") {
      return [n.name, (n.box.cls ? n.box.cls + " · " : "") + n.box.nodes + " nodes",
              "saved " + fmtBytes(Number(n.box.saved_bytes || 0))];
    }
    return n.kind === "custom" ? [n.name, "(custom Function)"] : [n.name];
  }
  function colorOf(v) {
    if (v.key) return COLORS.module;
    const n = v.node;
    if (n.kind === "module") return n.box && n.box.repeat ? COLORS.folded : COLORS.module;
    if (n.kind === "output" && n.view_base) return COLORS.base;
    return COLORS[n.kind] || COLORS.op;
  }

  function visibleGraph() {
    const vis = new Map();
    for (const n of D.nodes) {
      const [vid, cluster] = rep(n);
      if (!vis.has(vid)) {
        const isBox = vid.startsWith("box:");
        vis.set(vid, { id: vid, cluster, node: isBox ? null : n, key: isBox ? vid.slice(4) : null });
      }
    }
    const clusters = new Set();
    for (const v of vis.values()) {
      let k = v.cluster;
      while (k && !clusters.has(k)) { clusters.add(k); k = mods[k].parent; }
    }
    const edges = new Map();
    for (const [src, dst, kind, count] of D.edges) {
      const a = rep(byId.get(src))[0], b = rep(byId.get(dst))[0];
      if (a === b) continue;
      const id = b + "\u0000" + a; // drawn forward: input -> op, as torchviz does
      const e = edges.get(id);
      if (e) e.count += count; else edges.set(id, { from: b, to: a, count, view: kind === "view" });
    }
    return { vis, clusters, edges };
  }

  // ------------------------------------------------------------------ layout and drawing
  function make(tag, attrs, parent) {
    const el = document.createElementNS(NS, tag);
    for (const k in attrs) el.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(el);
    return el;
  }
  function render(keepView) {
    const { vis, clusters, edges } = visibleGraph();
    const g = new dagre.graphlib.Graph({ compound: true });
    g.setGraph({ rankdir: "TB", nodesep: 16, ranksep: 30, marginx: 30, marginy: 30 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const k of clusters) g.setNode("c:" + k, { paddingTop: 24 });
    for (const k of clusters) if (mods[k].parent) g.setParent("c:" + k, "c:" + mods[k].parent);
    for (const v of vis.values()) {
      v.lines = labelOf(v);
      const width = 16 + 6.7 * Math.max(...v.lines.map((l) => l.length));
      g.setNode(v.id, { width, height: 8 + 14 * v.lines.length });
      if (v.cluster) g.setParent(v.id, "c:" + v.cluster);
    }
    for (const e of edges.values()) g.setEdge(e.from, e.to, e);
    dagre.layout(g);
    layoutSize = { width: g.graph().width || 1, height: g.graph().height || 1 };
    viewport.textContent = "";
    const sorted = [...clusters].sort((a, b) => mods[a].depth - mods[b].depth);
    for (const k of sorted) drawCluster(k, g.node("c:" + k));
    for (const e of edges.values()) drawEdge(e, g.edge(e.from, e.to));
    for (const v of vis.values()) drawNode(v, g.node(v.id));
    status.textContent = vis.size + " of " + D.nodes.length + " nodes shown · " + D.summary;
    if (!keepView) fit();
    if (selected) highlight(selected);
  }
  function drawCluster(key, c) {
    const m = mods[key];
    const grp = make("g", { class: "cluster", "data-path": key }, viewport);
    const x = c.x - c.width / 2, y = c.y - c.height / 2 - 14;
    make("rect", { class: "frame", x, y, width: c.width, height: c.height + 14 }, grp);
    const title = make("g", { class: "title", "data-path": key }, grp);
    const text = "− " + m.label + (m.cls ? ": " + m.cls : "");
    make("rect", { x, y, width: Math.min(c.width, 14 + 6.7 * text.length), height: 17, rx: 4 }, title);
    const t = make("text", { x: x + 5, y: y + 12 }, title);
    t.textContent = text;
    make("title", {}, title).textContent = key + " (click to collapse)";
    title.addEventListener("click", (ev) => { ev.stopPropagation(); expanded.delete(key); render(true); });
  }
  function drawEdge(e, info) {
    const pts = info.points;
    const d = pts.map((p, i) => (i ? "L" : "M") + p.x.toFixed(1) + " " + p.y.toFixed(1)).join(" ");
    make("path", { class: "edge" + (e.view ? " view" : ""), d, "marker-end": "url(#arrow)" }, viewport);
    if (e.count > 1) {
      const mid = pts[Math.floor(pts.length / 2)];
      const t = make("text", { class: "elabel", x: mid.x + 4, y: mid.y }, viewport);
      t.textContent = "x" + e.count;
    }
  }
  function drawNode(v, pos) {
    const grp = make("g", { class: "node", "data-id": v.id, transform: `translate(${pos.x - pos.width / 2},${pos.y - pos.height / 2})` }, viewport);
    if (v.key) grp.classList.add("box");
    else grp.classList.add("kind-" + v.node.kind);
    const isModule = v.key || v.node.kind === "module";
    make("rect", { width: pos.width, height: pos.height, fill: colorOf(v), rx: isModule ? 1 : 3,
                   "stroke-width": isModule ? 2 : 1 }, grp);
    v.lines.forEach((line, i) => {
      const t = make("text", { x: pos.width / 2, y: 15 + 14 * i, "text-anchor": "middle" }, grp);
      t.textContent = line;
    });
    make("title", {}, grp).textContent = v.key ? v.key + " (click to expand)" : (v.node.module || v.node.name);
    grp.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (v.key) { expanded.add(v.key); selected = "box:" + v.key; showModule(v.key); render(true); }
      else { selected = v.id; showNode(v.node); highlight(v.id); }
    });
  }
  function highlight(id) {
    for (const el of viewport.querySelectorAll(".node.selected")) el.classList.remove("selected");
    const el = viewport.querySelector(`.node[data-id="${CSS.escape(id)}"]`);
    if (el) el.classList.add("selected");
  }

  // ------------------------------------------------------------------ details panel
  function row(table, k, v) {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = k;
    const td = document.createElement("td"); td.textContent = v;
    tr.append(th, td); table.appendChild(tr);
  }
  function section(title) {
    const h = document.createElement("h3"); h.textContent = title; details.appendChild(h);
    const table = document.createElement("table"); details.appendChild(table);
    return table;
  }
  function header(text) {
    details.textContent = "";
    const h = document.createElement("h2"); h.textContent = text; details.appendChild(h);
  }
  function showNode(n) {
    header(n.name || n.kind);
    const info = section("node");
    row(info, "id", n.id);
    row(info, "kind", n.kind);
    row(info, "module", n.module === null ? n.key || "(none)" : n.module || "(root)");
    if (n.key && mods[n.key]) row(info, "class", mods[n.key].cls);
    if (n.tensor) {
      row(info, "shape", shape(n.tensor.shape));
      row(info, "dtype", n.tensor.dtype + " on " + n.tensor.device);
    }
    if (n.saved.length) {
      const t = section("saved tensors (" + fmtBytes(n.bytes) + ")");
      t.classList.add("saved");
      const LIMIT = 300; // a folded box may carry thousands: show the first ones
      const head = document.createElement("tr");
      for (const h of ["name", "shape", "dtype", "bytes"]) {
        const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
      }
      t.appendChild(head);
      for (const s of n.saved.slice(0, LIMIT)) {
        const tr = document.createElement("tr");
        const bytes = s.freed ? "freed" : s.nbytes + " B (" + fmtBytes(s.nbytes) + ")";
        for (const val of [s.name, shape(s.shape), s.dtype || "", bytes]) {
          const td = document.createElement("td"); td.textContent = val; tr.appendChild(td);
        }
        t.appendChild(tr);
      }
      if (n.saved.length > LIMIT) {
        const p = document.createElement("p");
        p.textContent = "… and " + (n.saved.length - LIMIT) + " more saved tensors";
        details.appendChild(p);
      }
    }
    const keys = Object.keys(n.attrs);
    if (keys.length) {
      const t = section("attributes");
      for (const k of keys.sort()) row(t, k, n.attrs[k]);
    }
  }
  function showModule(key) {
    const m = mods[key];
    header(key);
    const info = section("module");
    row(info, "kind", "module");
    row(info, "module", key);
    row(info, "class", m.cls || "?");
    row(info, "nodes", String(m.nodes));
    row(info, "saved", m.bytes + " B (" + fmtBytes(m.bytes) + ")");
  }

  // ------------------------------------------------------------------ search
  function matches(q) {
    q = q.trim().toLowerCase();
    if (!q) return [];
    const out = [];
    for (const n of D.nodes) {
      if ((n.name || "").toLowerCase().includes(q) || (n.module || "").toLowerCase().includes(q)) {
        out.push(n);
        if (out.length >= 50) break;
      }
    }
    return out;
  }
  function reveal(n) {
    for (const key of chainOf(n.key)) expanded.add(key);
    selected = n.id;
    render(true);
    showNode(n);
    center(n.id);
  }
  search.addEventListener("input", () => {
    results.textContent = "";
    for (const n of matches(search.value)) {
      const li = document.createElement("li");
      li.textContent = n.name + "  " + (n.module || "") + "  " + n.id;
      li.dataset.id = n.id;
      li.addEventListener("click", () => reveal(n));
      results.appendChild(li);
    }
  });
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const found = matches(search.value);
    if (found.length) reveal(found[0]);
    else { details.textContent = "No node matches " + JSON.stringify(search.value) + "."; }
  });

  // ------------------------------------------------------------------ pan and zoom
  function apply() { viewport.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`); }
  function fit() {
    const r = svg.getBoundingClientRect();
    const k = Math.min(r.width / layoutSize.width, r.height / layoutSize.height, 1.5);
    view = { k, x: (r.width - layoutSize.width * k) / 2, y: (r.height - layoutSize.height * k) / 2 };
    apply();
  }
  function center(id) {
    const el = viewport.querySelector(`.node[data-id="${CSS.escape(id)}"]`);
    if (!el) return;
    const box = el.getBBox();
    const m = el.transform.baseVal.consolidate().matrix;
    const r = svg.getBoundingClientRect();
    view.k = Math.max(view.k, 1);
    view.x = r.width / 2 - (m.e + box.width / 2) * view.k;
    view.y = r.height / 2 - (m.f + box.height / 2) * view.k;
    apply();
  }
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    const px = ev.clientX - r.left, py = ev.clientY - r.top;
    const k = Math.min(Math.max(view.k * Math.exp(-ev.deltaY * 0.0015), 0.02), 8);
    view.x = px - ((px - view.x) * k) / view.k;
    view.y = py - ((py - view.y) * k) / view.k;
    view.k = k;
    apply();
  }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX - view.x, y: ev.clientY - view.y };
    svg.parentElement.classList.add("dragging");
  });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    view.x = ev.clientX - drag.x; view.y = ev.clientY - drag.y; apply();
  });
  window.addEventListener("mouseup", () => { drag = null; svg.parentElement.classList.remove("dragging"); });
  document.getElementById("fit").addEventListener("click", fit);
  document.getElementById("expand-all").addEventListener("click", () => {
    for (const k in mods) expanded.add(k);
    render(false);
  });
  document.getElementById("collapse-all").addEventListener("click", () => { expanded.clear(); render(false); });
  window.addEventListener("resize", fit);
  render(false);
})();
