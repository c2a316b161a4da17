// gradscope's HTML viewer. The graph is a tree of containers (modules, folds of repeated
// layers, chunks of long runs); an open container is laid out on its own (layout.js, in a Web
// Worker) with its open children as boxes of known size, and everything is drawn on a canvas,
// culled to the viewport. window.gradscope is the scripting interface (README: "The HTML page").
(function () {
  "use strict";
  const T = { start: performance.now() };
  const D = JSON.parse(document.getElementById("gs-data").textContent);
  T.parsed = performance.now();
  const COLORS = D.style.colors;
  const NORM = D.style.norm;
  const OPT = D.options;
  const KINDS = D.kinds; // the model's node kinds (nodes.KINDS): a row's kind is an index
  // The data contract (html.py FIELDS): each row is a list whose positions D.fields names.
  const fieldsOf = (table) => Object.fromEntries(D.fields[table].map((name, i) => [name, i]));
  const NF = fieldsOf("nodes"), EF = fieldsOf("edges"), CF = fieldsOf("containers");
  const SF = fieldsOf("saved"), TF = fieldsOf("tensor"), BF = fieldsOf("box"), RF = fieldsOf("region");
  const PLAIN_EDGE = D.edge_kinds.indexOf("grad"); // other edge kinds are drawn dotted
  // A node's info (page_data.py INFO): a dict of the fields set, read as info[K.<name>]; a field
  // with a label is shown in the details panel as it is (the viewer has no code for it).
  const K = Object.fromEntries(D.info.map(([name, key]) => [name, key]));
  const SHOWN_AS_IS = D.info.filter(([, , label]) => label);
  // Container kinds (page_data.py CONTAINER_KINDS) come as letters: read by name.
  const CKIND = Object.fromEntries(Object.entries(D.container_kinds).map(([name, code]) => [code, name]));
  const $ = (id) => document.getElementById(id);
  const canvas = $("graph"), ctx = canvas.getContext("2d");
  const detailsEl = $("details"), resultsEl = $("results"), searchEl = $("search");
  const statusEl = $("status"), progressEl = $("progress"), noteEl = $("note");

  // ------------------------------------------------------------------ the data
  // The header (containers, options) is one JSON block; nodes and edges come in blocks of
  // columns (class gs-part, views/page_wire.py) after their names and infos, each parsed in
  // its own task so a big graph never blocks the page.
  const N = D.n_nodes, E = D.n_edges;
  // (an array of a million left as new Array(n) leaves it is in V8's slow dictionary mode)
  const filled = (n, v) => new Array(n).fill(v);
  const nodeId = filled(N, ""), nodeName = filled(N, ""), nodeKind = new Uint8Array(N);
  const nodeC = new Int32Array(N), nodeInfo = filled(N, undefined);
  let idMap = null; // node id -> index, made on first use (a million ids cost a third of a second)
  function idIndex(id) {
    if (!idMap) { idMap = new Map(); for (let n = 0; n < N; n++) idMap.set(nodeId[n], n); }
    return idMap.get(id);
  }
  const eSrc = new Int32Array(E), eDst = new Int32Array(E), eNr = new Int32Array(E);
  const eView = new Uint8Array(E), eCount = new Int32Array(E), eNorm = filled(E, null);
  // a diff page (views/diff.py): node marks in their info, gradient-norm ratios b/a by edge
  const DIFF = D.diff || null;
  let hasSavedEdges = false; // a compiled region's saved-activation links: in the legend
  const eRatio = new Map(DIFF ? DIFF.ratios : []);
  const eDiff = new Map(DIFF ? DIFF.edges : []); // edge index -> "added" / "removed"
  const DIFF_COLORS = { added: "#8ce99a", removed: "#ff8787", changed: "#ffd43b" };
  const DIFF_EDGES = { added: "#2b8a3e", removed: "#e03131" };
  // a page rendered with --doctor (page_data.py doctor): the findings, each with its nodes
  // [role, node index]; those nodes are outlined, labelled, and "Go to finding" visits them
  const DOCTOR = D.doctor || null, DOCTOR_COLOR = "#c2255c";
  const doctorTargets = DOCTOR ? DOCTOR.findings.flatMap((f) => f.nodes.map(([, i]) => i)) : [];
  let doctorNext = 0;
  // a numerics page (page_data.py numerics, gs.trace_divergence): each node's error against a
  // reference run, a row of D.fields.numerics in its info; the nodes are filled by the error's
  // band (NUM.scale: the one scale's colours), the first divergence outlined and shown first
  const NUM = D.numerics || null, NUMF = fieldsOf("numerics"), NUM_FIRST = NUM ? NUM.first : -1, NUM_STROKE = "#7a0000";
  // A graph's first view is parsed, laid out and drawn in the task that saw the document
  // parsed, before the load event: a page captured at load (``chromium --headless
  // --screenshot``, the way documentation pipelines take pictures) shows the graph, not a blank
  // canvas. A small first view (MAIN_FIRST_ITEMS) of a graph up to QUICK_NODES is laid out by
  // dagre there; a bigger one of up to SKETCH_ITEMS boxes is drawn from a sketch (layout.js ``sketch``: one pass, no dagre)
  // and laid out for real right after (the worker). Graphs over SKETCH_NODES, and first views
  // over SKETCH_ITEMS (a --full page), take their usual steps, each a task of its own: parsing,
  // labelling and drawing them in one task would hold the page too long.
  const QUICK_NODES = 1500, SKETCH_NODES = 10000, SKETCH_ITEMS = 1000;
  let quick = false, sketched = false, replacing = false;
  // lets timers, input and paint run (a resolved promise while the quick first view is made):
  // a message to itself, not setTimeout(0), which Chromium holds back 4 ms once timers nest
  // (400 blocks of a million-node page would wait 1.6 s doing nothing)
  const channel = new MessageChannel(), woken = [];
  channel.port1.onmessage = () => { const r = woken.shift(); if (r) r(); };
  const tick = () => (quick ? Promise.resolve() : new Promise((r) => { woken.push(r); channel.port2.postMessage(0); }));
  // blocks are parsed in slices of about this many milliseconds, a task each
  const SLICE_MS = 30;
  async function loadParts() {
    // the blocks follow this script: the HTML parser reads them in its own slices of time
    if (document.readyState === "loading") await new Promise((r) => document.addEventListener("DOMContentLoaded", r));
    await tick();
    buildContainers();
    // (views/page_wire.py) a block is a list of columns in D.fields order, a column all at its
    // default null; a node's name and info are indices into the names and infos blocks, which
    // come first; a null id column means each id is "n" and the row's index
    const names = [], infos = [];
    let i = 0, k = 0, sliceEnd = performance.now() + SLICE_MS;
    for (const el of document.querySelectorAll("script.gs-part")) {
      if (performance.now() >= sliceEnd) { await tick(); sliceEnd = performance.now() + SLICE_MS; }
      const b = JSON.parse(el.textContent), kind = el.dataset.kind;
      if (kind === "names") { for (const v of b) names.push(v); continue; }
      if (kind === "infos") { for (const v of b) infos.push(v); continue; }
      if (kind === "nodes") {
        const ids = b[NF.id], nm = b[NF.name], kd = b[NF.kind], ct = b[NF.container], inf = b[NF.info];
        for (let q = 0; q < kd.length; q++, i++) {
          nodeId[i] = ids ? ids[q] : "n" + i; nodeName[i] = names[nm[q]]; nodeKind[i] = kd[q];
          nodeC[i] = ct[q]; nodeInfo[i] = inf && inf[q] >= 0 ? infos[inf[q]] : null;
        }
      } else if (kind === "edges") {
        const src = b[EF.src], dst = b[EF.dst], nr = b[EF.input_nr], ek = b[EF.kind], cnt = b[EF.count], gn = b[EF.grad_norm];
        for (let q = 0; q < src.length; q++, k++) {
          eSrc[k] = src[q]; eDst[k] = dst[q]; eNr[k] = nr ? nr[q] : 0;
          const v = ek ? ek[q] : 0;
          eView[k] = v === PLAIN_EDGE ? 0 : v;
          eCount[k] = cnt ? cnt[q] : 1;
          eNorm[k] = gn ? gn[q] : null;
        }
      }
    }
    const savedKind = D.edge_kinds.indexOf("saved");
    for (let q = 0; q < E && !hasSavedEdges; q++) hasSavedEdges = eView[q] === savedKind;
    if (hasSavedEdges) buildLegend();
    if (i !== N || k !== E) throw new Error("the page's data is incomplete: " + i + " of " + N + " nodes, " + k + " of " + E + " edges");
    for (let n = 0; n < N; n++) C[nodeC[n]].nodes.push(n);
  }
  const M = D.containers.length;
  const C = new Array(M); // filled by buildContainers, in a task of its own
  const ORDER = []; // containers, parents first
  const byPath = new Map();
  function buildContainers() {
    D.containers.forEach((r, j) => {
      C[j] = {
        j, path: r[CF.path], label: r[CF.label], cls: r[CF.cls], kind: CKIND[r[CF.kind]],
        parent: r[CF.parent], depth: r[CF.depth], count: r[CF.count], bytes: r[CF.saved_bytes],
        members: r[CF.members] || null, sumCount: r[CF.sum_count] || 0,
        sumBytes: r[CF.sum_bytes] || 0, range: r[CF.range] || "",
        kids: [], nodes: [], fold: -1, level: 0,
      };
    });
    for (const c of C) if (c.parent >= 0) C[c.parent].kids.push(c.j);
    ORDER.push(0);
    for (let q = 0; q < ORDER.length; q++) { // breadth-first (an index, not Array.shift: O(n))
      const j = ORDER[q];
      for (const k of C[j].kids) { C[k].level = C[j].level + 1; ORDER.push(k); }
    }
    for (const c of C) if (c.kind === "fold") for (const m of c.members) C[m].fold = c.j;
    for (const c of C) if (c.kind !== "chunk" && !byPath.has(c.path)) byPath.set(c.path, c.j);
    for (const c of C) if (c.kind === "fold") byPath.set(c.path, c.j); // a fold's path is its own
    T.containers = performance.now();
  }

  // ------------------------------------------------------------------ state
  const expanded = new Uint8Array(M); // open containers (the root is always open)
  const unfolded = new Uint8Array(M); // folds drawn member by member
  expanded[0] = 1;
  // Inside a frame (a notebook) the side panel starts folded and opens, narrow, on a click;
  // folding the panel or the legend is remembered (where the page may store anything).
  const embedded = (() => { try { return window.top !== window.self; } catch (err) { return true; } })();
  function pref(name) { try { const v = localStorage.getItem("gradscope." + name); return v === null ? null : v === "1"; } catch (err) { return null; } }
  function keepPref(name, on) { try { localStorage.setItem("gradscope." + name, on ? "1" : "0"); } catch (err) { /* sandboxed */ } }
  const panelPref = pref("panel");
  let panelChosen = panelPref !== null;
  const toggles = { saved: !!OPT.saved, shapes: false, legend: pref("legend") !== false, minimap: true,
                    pathOnly: false, panel: panelPref === null ? !embedded : panelPref };
  // Text is drawn at 11 px times the zoom: no view the page opens by itself goes below 9 px.
  const READ_K = 9 / 11;
  let selected = -1; // a visible item key (see below)
  let overview = false; // the first view was made the overview (overviewFirst)
  let userMoved = false; // until the user pans or zooms, a resize shows the first view again
  let matches = new Set();

  // Visible item keys: node i -> i; container j as a box or open frame -> N + j; the summary of
  // fold j -> N + M + j.
  const BOX = N, SUM = N + M;
  // ports; a route's key is (a + 2) * ROUTE + (b + 2) of its ends' places among their container's
  // items (small integers, which maps hash fast; a container holds at most about CHUNK items)
  const IN = -1, OUT = -2, ROUTE = 16384;
  const NO_HOPS = Object.freeze([]); // an edge's up/down hops when it stays in one container
  const status = new Int32Array(M); // -1: open; else the key of the item that stands for it
  const drawnParent = new Int32Array(M); // the open container a drawn container sits in

  function computeStatus() {
    for (const j of ORDER) {
      const c = C[j];
      if (j === 0) { status[0] = -1; drawnParent[0] = -1; continue; }
      const f = c.fold;
      if (f >= 0 && status[f] === -1 && !unfolded[f]) {
        if (C[f].members[0] === j) {
          status[j] = expanded[j] ? -1 : BOX + j; drawnParent[j] = f;
        } else status[j] = SUM + f;
        continue;
      }
      const p = c.parent;
      if (status[p] !== -1) { status[j] = status[p]; continue; }
      if (C[p].kind === "fold" && !unfolded[p]) { status[j] = SUM + p; continue; } // a chunk of it
      status[j] = expanded[j] ? -1 : BOX + j;
      drawnParent[j] = p;
    }
  }
  function visOf(i) { const s = status[nodeC[i]]; return s === -1 ? i : s; }
  function containerOfItem(key) { // the open container an item is drawn in
    if (key < N) return nodeC[key];
    if (key < SUM) return drawnParent[key - BOX];
    return C[key - SUM].j; // a summary sits inside its (open) fold
  }

  // ------------------------------------------------------------------ labels and sizes
  let CW = 6.6; const LH = 13, FONT = "11px ui-monospace, SFMono-Regular, Menlo, monospace";
  const PAD = [8, 22, 8, 8]; // an open container's frame: left, top (title), right, bottom
  const PORT_INSET = 12; // where an edge enters an open frame: at least this far inside its sides
  function fmtBytes(n) {
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let i = -1;
    do { n /= 1024; i++; } while (n >= 1024 && i < units.length - 1);
    return n.toFixed(1) + " " + units[i];
  }
  function shapeText(s) { return s ? "(" + s.join(", ") + ")" : "(?)"; }
  function wrap(text, width) {
    const out = [];
    let line = "";
    for (const word of text.split(/(\s+)/)) {
      if ((line + word).length > width && line.trim()) { out.push(line.trimEnd()); line = word.trimStart(); }
      else line += word;
      while (line.length > width) { out.push(line.slice(0, width)); line = line.slice(width); }
    }
    if (line.trim()) out.push(line.trimEnd());
    return out;
  }
  function locationLines(at) {
    const m = /^(.*?:\d+):\s?(.*)$/s.exec(at);
    return m ? [m[1] + ":", ...wrap(m[2], 40)] : wrap(at, 40);
  }
  function modulePathOf(i) {
    const info = nodeInfo[i];
    if (info && info[K.module]) return info[K.module];
    let j = nodeC[i];
    while (j > 0 && C[j].kind === "chunk") j = C[j].parent;
    return C[j].path;
  }
  function leafLabel(i) {
    const name = nodeName[i] || KINDS[nodeKind[i]];
    const path = modulePathOf(i);
    return path && name.startsWith(path + ".") ? name.slice(path.length + 1) : name;
  }
  function nodeLines(i) {
    const kind = KINDS[nodeKind[i]], info = nodeInfo[i] || {};
    if (kind === "leaf" || kind === "output") {
      const lines = [leafLabel(i)];
      if (info[K.tensor]) lines.push(shapeText(info[K.tensor][TF.shape]));
      if (info[K.memory]) lines.push(info[K.memory]);
      if (info[K.numerics]) lines.push(...numLines(i, info[K.numerics]));
      return lines;
    }
    if (kind === "module") {
      const b = info[K.box] || [];
      return [nodeName[i], (b[BF.cls] ? b[BF.cls] + " · " : "") + (b[BF.nodes] || 0) + " nodes", "saved " + fmtBytes(b[BF.saved_bytes] || 0)];
    }
    // (what this and savedBoxes read of an op is listed once more in OP_LABEL_FIELDS)
    const lines = [(info[K.order] !== undefined ? "#" + info[K.order] + " " : "") + nodeName[i]];
    if (kind === "custom") lines.push("(custom Function)");
    if (toggles.shapes && info[K.shape]) lines.push("→ " + shapeText(info[K.shape]));
    if (info[K.memory]) lines.push(info[K.memory]);
    if (info[K.doctor]) lines.push(...wrap("⚑ " + info[K.doctor], 44));
    if (info[K.numerics]) lines.push(...numLines(i, info[K.numerics]));
    if (info[K.forward_nonfinite]) lines.push(info[K.forward_nonfinite] + " first made here, in the forward");
    if (info[K.nonfinite]) lines.push((info[K.first_nonfinite] ? "first " : "") + info[K.nonfinite] + " gradient");
    // the line that made the first NaN/Inf: the forward's, or the first non-finite gradient's
    if (info[K.created_at] && (info[K.forward_nonfinite] || info[K.first_nonfinite])) lines.push(...locationLines(info[K.created_at]));
    return lines;
  }
  // a numerics page: the node's error against the reference and its amplification, on its box
  function fmtErr(x) {
    if (x === "nan" || x === "inf" || x === "-inf") return x;
    return x === 0 ? "0" : x >= 0.01 && x < 1000 ? String(+x.toPrecision(2)) : x.toExponential(1).replace(".0e", "e");
  }
  function numLines(i, r) {
    const amp = r[NUMF.amplification], lines = ["err " + fmtErr(r[NUMF.error]) + " · " + (amp === "inf" ? "new" : fmtErr(amp) + "x")];
    if (i === NUM_FIRST) lines.push("◆ first divergence");
    return lines;
  }
  function boxLines(j) {
    const c = C[j];
    if (c.kind === "chunk") return [c.label, c.range + " · click to open"];
    const head = c.kind === "fold" ? c.label + " (" + c.members.length + " alike)" : c.label;
    return [head, (c.cls ? c.cls + " · " : "") + c.count + " nodes", "saved " + fmtBytes(c.bytes)];
  }
  function summaryLines(f) {
    const c = C[f], first = C[c.members[0]].label, last = C[c.members[c.members.length - 1]].label;
    const rest = c.members.length - 1;
    const range = rest === 1 ? last : C[c.members[1]].label + " … " + last;
    return [range + " ×" + rest, "like " + first + " · " + c.sumCount + " nodes",
            "saved " + fmtBytes(c.sumBytes) + " · click to open"];
  }
  function frameTitle(j) {
    const c = C[j];
    if (j === 0) return "";
    if (c.kind === "fold") return "− " + c.label + ": " + (c.cls || "?") + " — " + (unfolded[j]
      ? "all " + c.members.length + " drawn" : C[c.members[0]].label + " drawn, " + (c.members.length - 1) + " alike summarised");
    if (c.kind === "chunk") return "− " + c.label + " · " + c.range;
    return "− " + c.label + (c.cls ? ": " + c.cls : "");
  }
  function savedBoxes(i) { // [lines, w] of each saved tensor drawn next to its node
    const info = nodeInfo[i];
    if (!toggles.saved || !info || !info[K.saved] || KINDS[nodeKind[i]] === "module") return null;
    return info[K.saved].map((s) => {
      const lines = [s[SF.name], s[SF.freed] ? "freed" : shapeText(s[SF.shape])];
      return { lines, w: 10 + CW * Math.max(...lines.map((l) => l.length)), freed: !!s[SF.freed] };
    });
  }
  function textWidth(lines) { return 12 + CW * Math.max(1, ...lines.map((l) => l.length)); }

  // ------------------------------------------------------------------ the visible graph
  // Returns {items: ItemTable key -> item, open: [container j, parents first], edges: [...]}.
  const labelCache = filled(N, null); // a node's lines and widths, until a toggle changes them
  const sharedLabels = new Map(); // the same for ops with only a name: kind and name -> label
  // Labels of the same text are one object (a million ops of a chain, each with its saved
  // tensor, are a handful of labels, not a million): text -> label, for this labelState.
  let interned = new Map(), internedState = -1;
  const LEAF = KINDS.indexOf("leaf"), OUTPUT = KINDS.indexOf("output"), MODULE = KINDS.indexOf("module");
  let labelState = 0;
  function labelKey(lines, saved) { // unambiguous: each line with its length
    let t = "";
    for (const l of lines) t += l.length + ":" + l;
    if (saved) for (const b of saved) { t += "|" + (b.freed ? 1 : 0); for (const l of b.lines) t += l.length + ":" + l; }
    return t;
  }
  function nodeLabel(key) {
    // an op with nothing but its name (most of a long chain) shares its label with its likes
    const plain = nodeInfo[key] === null && nodeKind[key] !== LEAF && nodeKind[key] !== OUTPUT && nodeKind[key] !== MODULE;
    let lab = plain ? sharedLabels.get(nodeKind[key] + "\u0000" + nodeName[key]) : labelCache[key];
    if (lab && lab.state === labelState) return lab;
    if (!plain && lastLabel && lastLabel.state === labelState && sameLabelInputs(key, lastLabelKey)) {
      labelCache[key] = lastLabel;
      return lastLabel;
    }
    if (internedState !== labelState) { interned = new Map(); internedState = labelState; }
    const lines = nodeLines(key), saved = savedBoxes(key), text = labelKey(lines, saved);
    lab = interned.get(text);
    if (!lab) {
      const cw = textWidth(lines);
      let w = cw, h = 6 + LH * lines.length;
      if (saved) { w += saved.reduce((a, b) => a + b.w + 4, 6); h = Math.max(h, 6 + LH * 2); }
      lab = { state: labelState, lines, cw, saved, w, h };
      interned.set(text, lab);
    }
    if (plain) sharedLabels.set(nodeKind[key] + "\u0000" + nodeName[key], lab);
    else { labelCache[key] = lab; lastLabel = lab; lastLabelKey = key; }
    return lab;
  }
  // What nodeLines and savedBoxes read of an op (not a leaf, output or module): its kind, name,
  // these info fields and its saved tensors' names, shapes and freed marks. A node whose are
  // the same as those of the node labelled before it has the same label, made without a string
  // (a million ops alike in a row). Values are compared as primitives or shape lists; anything
  // else by identity, which only ever makes a label anew. (A new field read there goes here.)
  let lastLabel = null, lastLabelKey = -1;
  const OP_LABEL_FIELDS = [K.order, K.shape, K.memory, K.doctor, K.numerics, K.forward_nonfinite, K.nonfinite, K.first_nonfinite, K.created_at];
  function sameValue(p, q) {
    if (p === q) return true;
    if (!Array.isArray(p) || !Array.isArray(q) || p.length !== q.length) return false;
    for (let n = 0; n < p.length; n++) if (p[n] !== q[n]) return false;
    return true;
  }
  function sameLabelInputs(i, j) {
    const kind = nodeKind[i];
    if (kind !== nodeKind[j] || kind === LEAF || kind === OUTPUT || kind === MODULE || nodeName[i] !== nodeName[j]) return false;
    if (i === NUM_FIRST || j === NUM_FIRST) return false; // its label says so
    const a = nodeInfo[i], b = nodeInfo[j];
    if (!a || !b) return false;
    if (a === b) return true; // one info of the page's table (views/page_wire.py): alike
    for (const f of OP_LABEL_FIELDS) if (!sameValue(a[f], b[f])) return false;
    const sa = a[K.saved], sb = b[K.saved];
    if (sa === sb) return true;
    if (!Array.isArray(sa) || !Array.isArray(sb) || sa.length !== sb.length) return false;
    for (let n = 0; n < sa.length; n++) {
      const x = sa[n], y = sb[n];
      if (x[SF.name] !== y[SF.name] || !x[SF.freed] !== !y[SF.freed] || !sameValue(x[SF.shape], y[SF.shape])) return false;
    }
    return true;
  }
  // A drawn item: a node, a closed container's box, an open one's frame, a fold's summary. Its
  // geometry (x, y, w, h, cw: the width of its own box, without saved tensors beside it) is read
  // and written as fields but kept in its view's Float64Array: a million items with numbers of
  // their own would be millions of heap numbers for the garbage collector.
  class Item {
    constructor(key, parent, local, g, o) {
      this.key = key; this.parent = parent; this.local = local; // local: its place in its container
      this.lines = null; this.saved = null; this.open = false; this._s = 0;
      this.g = g; this.o = o;
    }
    get x() { return this.g[this.o]; } set x(v) { this.g[this.o] = v; }
    get y() { return this.g[this.o + 1]; } set y(v) { this.g[this.o + 1] = v; }
    get w() { return this.g[this.o + 2]; } set w(v) { this.g[this.o + 2] = v; }
    get h() { return this.g[this.o + 3]; } set h(v) { this.g[this.o + 3] = v; }
    get cw() { return this.g[this.o + 4]; } set cw(v) { this.g[this.o + 4] = v; }
  }
  // A drawn edge (merged: every edge between the same two items): its ends' item keys a, b, what
  // its label says, where it is routed (buildView) and its points, [x0, y0, x1, y1, ...] in page
  // coordinates (place): pts, a view of the scene's one Float64Array of points, made when read.
  class Edge {
    constructor(a, b, count, norm, view, ratio, diff) {
      this.a = a; this.b = b; this.count = count; this.norm = norm; this.view = view; this.ratio = ratio; this.diff = diff;
      this.lca = 0; this.ca = 0; this.cb = 0; this.route = 0; this.up = NO_HOPS; this.down = NO_HOPS;
      this.pg = null; this.po = 0; this.pn = 0; this.i = 0; this.lab = null; this._s = 0;
    }
    get pts() { return this.pg === null ? null : this.pg.subarray(this.po, this.po + this.pn); }
  }
  // The drawn items by key (node i, BOX + j, SUM + f): an array, not a Map (a million keys),
  // with the Map calls the page makes; values() in the order they were added.
  class ItemTable {
    constructor(n) { this.at = filled(n, undefined); this.list = []; }
    get(key) { return this.at[key]; }
    has(key) { return this.at[key] !== undefined; }
    set(key, it) { if (this.at[key] === undefined) this.list.push(it); else this.list[this.list.indexOf(this.at[key])] = it; this.at[key] = it; return this; }
    values() { return this.list; }
    get size() { return this.list.length; }
  }
  function buildView() {
    computeStatus();
    const items = new ItemTable(SUM + M), at = items.at;
    const open = [];
    for (const j of ORDER) if (status[j] === -1) open.push(j);
    const direct = new Map(), directOf = filled(M, null); // open container -> item keys in it
    for (const j of open) { const keys = []; direct.set(j, keys); directOf[j] = keys; }
    // the items in the order they are added (open containers' frames, then what each node is
    // drawn as), counted first: their geometry lives in one array of this view (see Item)
    const seen = new Uint8Array(SUM + M), addKey = new Int32Array(N + 2 * M), addParent = new Int32Array(N + 2 * M);
    let count = 0;
    const note = (key, parent) => { if (!seen[key]) { seen[key] = 1; addKey[count] = key; addParent[count++] = parent; } };
    for (const j of open) if (j !== 0) note(BOX + j, drawnParent[j]);
    for (let i = 0; i < N; i++) {
      const s = status[nodeC[i]];
      if (s === -1) note(i, nodeC[i]);
      else if (s < SUM) note(s, drawnParent[s - BOX]);
      else note(s, s - SUM);
    }
    const geo = new Float64Array(5 * count);
    function add(key, parent) {
      const keys = directOf[parent];
      const it = new Item(key, parent, keys.length, geo, 5 * items.list.length);
      if (key < N) {
        const lab = nodeLabel(key);
        it.lines = lab.lines;
        it.cw = lab.cw;
        it.saved = lab.saved;
        it.w = lab.w;
        it.h = lab.h;
      } else if (key < SUM) {
        const j = key - BOX;
        it.open = status[j] === -1;
        if (!it.open) { it.lines = boxLines(j); it.cw = it.w = textWidth(it.lines); it.h = 8 + LH * it.lines.length; }
      } else {
        it.lines = summaryLines(key - SUM);
        it.cw = it.w = textWidth(it.lines); it.h = 8 + LH * it.lines.length;
      }
      at[key] = it; items.list.push(it);
      keys.push(key);
    }
    for (let q = 0; q < count; q++) add(addKey[q], addParent[q]);
    // edges between visible items, merged (in the order of their first edge); each routed in
    // the open container that holds both. Typed arrays, no map keyed by pairs: a million edges.
    const KEYS = SUM + M, ea = new Int32Array(E), eb = new Int32Array(E);
    const byA = new Int32Array(KEYS + 1);
    for (let k = 0; k < E; k++) {
      const a = visOf(eDst[k]), b = visOf(eSrc[k]); // drawn forward: input -> consumer
      ea[k] = a; eb[k] = b;
      if (a !== b) byA[a + 1]++;
    }
    for (let q = 0; q < KEYS; q++) byA[q + 1] += byA[q];
    const grouped = new Int32Array(byA[KEYS]), fill = byA.slice(0, KEYS);
    for (let k = 0; k < E; k++) if (ea[k] !== eb[k]) grouped[fill[ea[k]]++] = k;
    const rep = new Int32Array(E).fill(-1), seenA = new Int32Array(KEYS).fill(-1), firstK = new Int32Array(KEYS);
    for (let a = 0; a < KEYS; a++) {
      for (let q = byA[a]; q < byA[a + 1]; q++) {
        const k = grouped[q], b = eb[k];
        if (seenA[b] !== a) { seenA[b] = a; firstK[b] = k; }
        rep[k] = firstK[b];
      }
    }
    const mergedOf = new Int32Array(E), mergedList = [];
    for (let k = 0; k < E; k++) {
      const r = rep[k];
      if (r < 0) continue;
      if (r === k) {
        mergedOf[k] = mergedList.length;
        mergedList.push(new Edge(ea[k], eb[k], eCount[k], eNorm[k], !!eView[k], eRatio.has(k) ? eRatio.get(k) : null, eDiff.get(k) || null));
      } else {
        const m = mergedList[mergedOf[r]];
        m.count += eCount[k]; m.norm = null; m.ratio = null; m.view = m.view && eView[k]; if (m.diff !== eDiff.get(k)) m.diff = null;
      }
    }
    const level = new Int32Array(M); // depth of each open container in the drawn tree
    for (const j of open) level[j] = j === 0 ? 0 : level[drawnParent[j]] + 1;
    // An edge is routed in every open container it crosses: from its start to the container's
    // exit port (OUT, at the bottom of that container's layout), in the container holding both
    // ends, then from each entry port (IN, at the top) to its end: so no segment cuts straight
    // through an open module's contents.
    // A container's routes: [a0, b0, a1, b1, ...] (the places of their ends among its items, or
    // IN / OUT), a route's index its place there. A route between two drawn items (an edge that
    // stays in its container) is one merged edge's own: no two are alike, none is looked up. A
    // hop's route (to a port, or from an open container's frame) may be shared: found by key.
    const routes = new Map(), routesOf = filled(M, null), hopKeys = filled(M, null);
    for (const j of open) { const r = []; routes.set(j, r); routesOf[j] = r; }
    let RK = ROUTE; // the key's base: more than any container's items (a bigger one still works)
    for (const keys of direct.values()) if (keys.length + 4 > RK) RK = keys.length + 4;
    const ownRoute = (j, a, b) => { const r = routesOf[j]; r.push(at[a].local, at[b].local); return r.length / 2 - 1; };
    const route = (j, a, b) => { // a, b: item keys, or IN / OUT (the ports)
      const la = a < 0 ? a : at[a].local, lb = b < 0 ? b : at[b].local;
      const rk = (la + 2) * RK + (lb + 2);
      let m = hopKeys[j];
      if (m === null) { m = new Map(); hopKeys[j] = m; }
      let n = m.get(rk);
      if (n === undefined) { const r = routesOf[j]; n = r.length / 2; r.push(la, lb); m.set(rk, n); }
      return n;
    };
    const edges = [];
    for (const e of mergedList) {
      let ca = e.a, cb = e.b;
      let pa = containerOfItem(ca), pb = containerOfItem(cb);
      let up = NO_HOPS, down = NO_HOPS; // most edges stay in one container: no arrays made
      while (pa !== pb) {
        if (level[pa] >= level[pb]) { if (up === NO_HOPS) up = []; up.push(pa, route(pa, ca, OUT)); ca = BOX + pa; pa = drawnParent[pa]; }
        else { if (down === NO_HOPS) down = []; down.push(pb, route(pb, IN, cb)); cb = BOX + pb; pb = drawnParent[pb]; }
      }
      e.lca = pa; e.ca = ca; e.cb = cb;
      // (ends drawn in pa itself: a merged pair, met once; an open frame's or a port's: shared)
      e.route = up === NO_HOPS && down === NO_HOPS ? ownRoute(pa, ca, cb) : route(pa, ca, cb);
      e.up = up; e.down = down; // [container, route index, ...], innermost first
      e.i = edges.length; // its bounds: place() keeps them at 4 * i in the scene's ebox
      edges.push(e);
    }
    return { items, open, direct, routes, edges, rk: RK };
  }

  // Layout jobs in post-order (children first); job.key is the container it lays out.
  function makeJobs(view) {
    const jobs = [], jobOf = new Map();
    const post = view.open.slice().reverse(); // ORDER is parents-first: reversed, children first
    for (const j of post) {
      const keys = view.direct.get(j);
      const w = [], h = [], c = [];
      keys.forEach((k, n) => {
        const it = view.items.get(k);
        if (it.open) { w.push(0); h.push(0); c.push(n, jobOf.get(k - BOX)); }
        else { w.push(it.w); h.push(it.h); }
      });
      const e = [];
      const port = [-1, -1]; // IN, OUT
      const at = (k) => {
        if (k >= 0) return k; // the item's place in keys
        const q = k === IN ? 0 : 1;
        if (port[q] < 0) { port[q] = w.length; w.push(1); h.push(1); } // a port: a 1 px node
        return port[q];
      };
      const r = view.routes.get(j);
      for (let q = 0; q < r.length; q += 2) e.push(at(r[q]), at(r[q + 1]));
      // The ports go above and below everything in the container (unseen edges from the IN
      // port to every source and from every sink to the OUT port, after the routes): a route
      // that leaves the container then never crosses the boxes under its port.
      if (port[0] >= 0 || port[1] >= 0) {
        const hasIn = new Uint8Array(w.length), hasOut = new Uint8Array(w.length);
        for (let q = 0; q < e.length; q += 2) { hasOut[e[q]] = 1; hasIn[e[q + 1]] = 1; }
        const n = e.length;
        for (let i = 0; i < keys.length; i++) {
          if (port[0] >= 0 && !hasIn[i]) e.push(port[0], i);
          if (port[1] >= 0 && !hasOut[i]) e.push(i, port[1]);
        }
        if (port[0] >= 0 && port[1] >= 0 && e.length === n) e.push(port[0], port[1]);
      }
      jobOf.set(j, jobs.length);
      // A job with no open child the same as the job before it (a long chain's chunks) gets that
      // job's very arrays: the worker receives them once, and lays them out once (layout.js).
      const prev = jobs.length ? jobs[jobs.length - 1] : null;
      if (prev && c.length === 0 && prev.c.length === 0 && sameNumbers(w, prev.w) && sameNumbers(h, prev.h) && sameNumbers(e, prev.e)) {
        jobs.push({ w: prev.w, h: prev.h, c: prev.c, e: prev.e, pad: PAD, key: j });
      } else jobs.push({ w, h, c, e, pad: PAD, key: j });
    }
    return { jobs, jobOf };
  }
  function sameNumbers(p, q) {
    if (p.length !== q.length) return false;
    for (let n = 0; n < p.length; n++) if (p[n] !== q[n]) return false;
    return true;
  }

  // ------------------------------------------------------------------ the layout worker
  const layoutSource = document.getElementById("gs-dagre").textContent + "\n" +
    document.getElementById("gs-layout").textContent;
  let worker = null;
  try {
    const url = URL.createObjectURL(new Blob([layoutSource], { type: "text/javascript" }));
    worker = new Worker(url);
  } catch (err) { worker = null; }
  let requestId = 0;
  const pending = new Map();
  // A worker that starts but never answers (headless Chromium taking a screenshot, some
  // sandboxes) must not leave the page blank: each request is acknowledged at once (layout.js
  // posts {id, started} before it works), and one not acknowledged within WORKER_ACK_MS is
  // laid out here instead, the worker dropped for good.
  const WORKER_ACK_MS = 1000;
  // A first view this small (items over all jobs, biggest job) is laid out here at once, in
  // slices: it is drawn without waiting for the worker to start at all.
  const MAIN_FIRST_ITEMS = 400, MAIN_FIRST_JOB = 120;
  let workerAlive = false; // it has answered once
  function dropWorker() {
    if (!worker) return;
    try { worker.terminate(); } catch (err) { /* already gone */ }
    worker = null;
    for (const [id, p] of pending) { pending.delete(id); clearTimeout(p.watchdog); p.fallback(); }
  }
  if (worker) {
    worker.onerror = () => dropWorker();
    worker.onmessage = (ev) => {
      const { id, progress, results, started } = ev.data;
      workerAlive = true;
      const p = pending.get(id);
      if (!p) return;
      clearTimeout(p.watchdog);
      if (started) return;
      if (progress) { p.onProgress(progress); return; }
      pending.delete(id);
      p.resolve(results);
    };
  }
  function smallLayout(jobs) {
    let items = 0, biggest = 0;
    for (const j of jobs) { items += j.w.length; biggest = Math.max(biggest, j.w.length); }
    return items <= MAIN_FIRST_ITEMS && biggest <= MAIN_FIRST_JOB;
  }
  function runLayout(jobs, onProgress, here) {
    const clean = jobs.map((j) => ({ w: j.w, h: j.h, c: j.c, e: j.e, pad: j.pad }));
    const small = here && smallLayout(clean);
    if (quick && small && N <= QUICK_NODES) { // the quick first view: in this very task
      const t = window.gsLayout.task(clean);
      t.step(Infinity);
      return Promise.resolve(t.results);
    }
    if (quick && here) { // too big for dagre in this task: a sketch now, the layout next
      sketched = true;
      return Promise.resolve(window.gsLayout.sketch(clean));
    }
    quick = false;
    if (worker && !small) {
      const id = ++requestId;
      return new Promise((resolve, reject) => {
        const fallback = () => mainLayout(clean, onProgress).then(resolve, reject);
        const p = { resolve, reject, onProgress, fallback, watchdog: 0 };
        pending.set(id, p);
        if (!workerAlive) p.watchdog = setTimeout(dropWorker, WORKER_ACK_MS);
        try { worker.postMessage({ id, jobs: clean }); }
        catch (err) { dropWorker(); }
      });
    }
    return mainLayout(clean, onProgress);
  }
  // no worker (a sandbox without blob workers, or one that never answered), or a small first
  // view: the same code, in slices of the main thread
  function mainLayout(clean, onProgress) {
    return new Promise((resolve) => {
      const t = window.gsLayout.task(clean);
      (function slice() {
        if (t.step(40)) resolve(t.results);
        else { onProgress(t.progress()); setTimeout(slice, 0); }
      })();
    });
  }

  // ------------------------------------------------------------------ placing the scene
  let scene = null; // {items, frames, edges, bounds, grid}
  let generation = 0;
  let busy = null; // the promise of the layout in flight
  let again = false;

  function place(view, jobs, results) {
    // each open container's origin (its layout's top left on the page) and layout result
    const originX = new Float64Array(M), originY = new Float64Array(M), byJob = filled(M, null);
    const frames = [], at = view.items.at;
    jobs.jobs.forEach((job, n) => { byJob[job.key] = results[n]; });
    for (const j of view.open) {
      const r = byJob[j], ox = originX[j], oy = originY[j], rx = r.x, ry = r.y;
      const keys = view.direct.get(j);
      for (let n = 0; n < keys.length; n++) {
        const k = keys[n], it = at[k];
        it.x = ox + rx[n]; it.y = oy + ry[n];
        if (it.open) {
          const rr = byJob[k - BOX];
          it.w = rr.w + PAD[0] + PAD[2]; it.h = rr.h + PAD[1] + PAD[3];
          originX[k - BOX] = it.x + PAD[0]; originY[k - BOX] = it.y + PAD[1];
          frames.push(it);
        }
      }
    }
    // every edge's points in one array (a million arrays of their own: the garbage collector's)
    let P = new Float64Array(Math.max(64, 6 * view.edges.length)), pn = 0;
    const edges = [], NONE = [], scratch = [], ebox = new Float64Array(4 * view.edges.length);
    // A route of container j, in page coordinates; skip: leave out its first point.
    const follow = (pts, j, r, skip) => {
      const ox = originX[j], oy = originY[j]; // results are shared by identical containers: their own origin
      const flat = byJob[j].p[r] || NONE;
      for (let q = skip ? 2 : 0; q < flat.length; q += 2) pts.push(ox + flat[q], oy + flat[q + 1]);
    };
    // where an edge crosses the frame f at x: at least PORT_INSET inside its sides
    const portX = (f, x) => Math.min(Math.max(x, f.x + PORT_INSET), f.x + f.w - PORT_INSET);
    // Where a route crosses an open container's frame, the layout outside it ends on the frame's
    // outline, wherever the line to its centre meets it (often a side): the edge would cut back
    // across the frame to its port. It leaves by the exit port straight down through the bottom,
    // and enters straight down through the top to the entry port.
    for (const e of view.edges) {
      const a = at[e.a], b = at[e.b];
      const pts = scratch;
      pts.length = 0;
      pts.push(a.x + (a.cw || a.w) / 2, a.y + a.h);
      let out = false; // the last point is an exit port: the next route's outline point is replaced
      for (let q = 0; q < e.up.length; q += 2) {
        const m = pts.length;
        follow(pts, e.up[q], e.up[q + 1], out);
        const f = at[BOX + e.up[q]], n = pts.length;
        if (n - m >= 2 && n >= 4) {
          // the exit port moved under the route's last bend (alone in its container's bottom
          // rank, it crosses nothing there): the route leaves straight down, where a port the
          // layout put aside made it zigzag; under the box itself when it is the bend, not the
          // outline point of the box and its saved tensors that the ends replace below
          const bend = n === 6 && q === 0 ? 0 : n - 4;
          pts[n - 2] = portX(f, pts[bend]);
        }
        pts.push(pts[pts.length - 2], f.y + f.h);
        out = true;
      }
      follow(pts, e.lca, e.route, out);
      for (let q = e.down.length - 2; q >= 0; q -= 2) {
        const j = e.down[q], f = at[BOX + j], flat = byJob[j].p[e.down[q + 1]] || NONE;
        if (flat.length) {
          // the outline point -> the frame's top where the route came (inside the frame), and
          // the entry port moved under it: the port is alone in its container's top rank, so
          // the route drops straight in, where a port the layout put aside made it zigzag
          const x = portX(f, pts[pts.length - 2]);
          pts.length -= 2;
          pts.push(x, f.y, x, originY[j] + flat[1]);
          follow(pts, j, e.down[q + 1], true);
        } else follow(pts, j, e.down[q + 1], false);
      }
      pts.push(b.x + (b.cw || b.w) / 2, b.y);
      // ends: the boxes' own, in place of the first and the last routes' outline points (the
      // outline of a box with its saved tensors: the arrow would point at a saved tensor)
      const n = pts.length;
      if (n >= 8) { // [a, first outline, ..., last outline, b] -> [a, ..., b]
        for (let q = 2; q < n - 6; q++) pts[q] = pts[q + 2];
        pts[n - 6] = pts[n - 2]; pts[n - 5] = pts[n - 1];
        pts.length = n - 4;
      } else if (n === 6) { // [a, one outline point, b] -> [a, b]
        pts[2] = pts[4]; pts[3] = pts[5];
        pts.length = 4;
      }
      { // the last bend straight above b's port: the arrow comes down onto its own box
        const m = pts.length, bx = pts[m - 2], by = pts[m - 1], py = pts[m - 3];
        if (m >= 4 && Math.abs(pts[m - 4] - bx) > 1 && by - py > 4) {
          pts[m - 2] = bx; pts[m - 1] = by - Math.min(8, (by - py) / 2);
          pts.push(bx, by);
        }
      }
      { // and the first straight under a's: the edge leaves its own box downwards
        const ax = pts[0], ay = pts[1], ny = pts[3];
        if (pts.length >= 4 && Math.abs(pts[2] - ax) > 1 && ny - ay > 4) {
          pts.splice(2, 0, ax, ay + Math.min(8, (ny - ay) / 2));
        }
      }
      if (pn + pts.length > P.length) { const bigger = new Float64Array(2 * P.length + pts.length); bigger.set(P.subarray(0, pn)); P = bigger; }
      e.po = pn; e.pn = pts.length;
      for (let q = 0; q < pts.length; q++) P[pn++] = pts[q];
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (let q = 0; q < pts.length; q += 2) {
        const x = pts[q], y = pts[q + 1];
        if (x < x0) x0 = x; if (x > x1) x1 = x;
        if (y < y0) y0 = y; if (y > y1) y1 = y;
      }
      const q4 = 4 * e.i;
      ebox[q4] = x0; ebox[q4 + 1] = y0; ebox[q4 + 2] = x1; ebox[q4 + 3] = y1;
      edges.push(e);
    }
    for (const e of edges) e.pg = P;
    const root = byJob[0];
    const nodes = [];
    for (const it of view.items.values()) if (!it.open) nodes.push(it);
    frames.sort((p, q) => containerLevel(p.key - BOX) - containerLevel(q.key - BOX));
    const bounds = { w: Math.max(root.w, 1), h: Math.max(root.h, 1) };
    const s = { items: view.items, nodes, frames, edges, ebox, bounds, view };
    s.grid = makeGrid(s);
    s.adj = null; // made on first use (a selection): adjacencyOf(s)
    placeLabels(s);
    return s;
  }
  function containerLevel(j) { return C[j].level; }

  const CELL = 400, LONG_CELLS = 12;
  function makeGrid(s) {
    const g = new Map();
    s.gridEntries = 0; // objects put in cells, all cells: linear in what is drawn
    let entries = 0, lastId = NaN, lastCell = null;
    function put(obj, x0, y0, x1, y1, kind) { // kind: 0 a box, 1 a frame, 2 an edge
      const cx0 = Math.floor(x0 / CELL), cx1 = Math.floor(x1 / CELL);
      const cy0 = Math.floor(y0 / CELL), cy1 = Math.floor(y1 / CELL);
      for (let cx = cx0; cx <= cx1; cx++) for (let cy = cy0; cy <= cy1; cy++) {
        const id = cx * 100003 + cy;
        let cell = id === lastId ? lastCell : g.get(id); // (most puts land in the cell before)
        if (!cell) { cell = { n: [], f: [], e: [] }; g.set(id, cell); }
        lastId = id; lastCell = cell;
        (kind === 0 ? cell.n : kind === 1 ? cell.f : cell.e).push(obj);
        entries++;
      }
    }
    for (const it of s.nodes) put(it, it.x, it.y, it.x + it.w, it.y + it.h, 0);
    for (const it of s.frames) {
      // a frame is drawn only where it is: its four sides and its title bar, not its inside
      put(it, it.x, it.y, it.x + it.w, it.y + PAD[1], 1);
      put(it, it.x, it.y, it.x, it.y + it.h, 1); put(it, it.x + it.w, it.y, it.x + it.w, it.y + it.h, 1);
      put(it, it.x, it.y + it.h, it.x + it.w, it.y + it.h, 1);
    }
    // An edge whose box spans many cells (one op's thousands of inputs, laid out side by side)
    // is kept in a list of its own, tested against the view by its box: put in every cell it
    // spans, N such edges would fill N x (the graph's width) cells.
    s.long = [];
    const b = s.ebox;
    for (const e of s.edges) {
      const x0 = b[4 * e.i], y0 = b[4 * e.i + 1], x1 = b[4 * e.i + 2], y1 = b[4 * e.i + 3];
      const cells = (Math.floor(x1 / CELL) - Math.floor(x0 / CELL) + 1) * (Math.floor(y1 / CELL) - Math.floor(y0 / CELL) + 1);
      if (cells > LONG_CELLS) s.long.push(e);
      else put(e, x0, y0, x1, y1, 2);
    }
    s.gridEntries = entries;
    return g;
  }
  let stamp = 0;
  function query(x0, y0, x1, y1) {
    const out = { n: [], f: [], e: [] };
    if (!scene) return out;
    stamp++;
    const cx0 = Math.floor(x0 / CELL), cx1 = Math.floor(x1 / CELL);
    const cy0 = Math.floor(y0 / CELL), cy1 = Math.floor(y1 / CELL);
    if ((cx1 - cx0 + 1) * (cy1 - cy0 + 1) > scene.grid.size) { // zoomed far out: everything
      for (const it of scene.nodes) out.n.push(it);
      for (const it of scene.frames) out.f.push(it);
      for (const e of scene.edges) out.e.push(e);
      return out;
    }
    for (let cx = cx0; cx <= cx1; cx++) for (let cy = cy0; cy <= cy1; cy++) {
      const cell = scene.grid.get(cx * 100003 + cy);
      if (!cell) continue;
      for (const kind of ["n", "f", "e"]) for (const o of cell[kind]) {
        if (o._s === stamp) continue;
        o._s = stamp; out[kind].push(o);
      }
    }
    const b = scene.ebox;
    for (const e of scene.long) if (b[4 * e.i] <= x1 && b[4 * e.i + 2] >= x0 && b[4 * e.i + 1] <= y1 && b[4 * e.i + 3] >= y0) out.e.push(e);
    out.f.sort((p, q) => containerLevel(p.key - BOX) - containerLevel(q.key - BOX));
    return out;
  }
  function adjacencyOf(s) { if (!s.adj) s.adj = adjacency(s); return s.adj; }
  function adjacency(s) {
    const up = new Map(), down = new Map(); // item -> inputs, item -> consumers
    for (const e of s.edges) {
      if (!down.has(e.a)) down.set(e.a, []);
      if (!up.has(e.b)) up.set(e.b, []);
      down.get(e.a).push(e.b); up.get(e.b).push(e.a);
    }
    return { up, down };
  }

  // ------------------------------------------------------------------ drawing
  let view = { x: 0, y: 0, k: 1 };
  let cssW = 1, cssH = 1, dpr = 1;
  let frameRequested = false;
  let related = null; // {up: Set, down: Set} of the selection
  function resizeCanvas() {
    const r = canvas.parentElement.getBoundingClientRect();
    dpr = window.devicePixelRatio || 1;
    cssW = Math.max(1, r.width); cssH = Math.max(1, r.height);
    canvas.width = Math.round(cssW * dpr); canvas.height = Math.round(cssH * dpr);
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
  }
  function syncSize() { // the canvas follows its box (the first layout may end before styles settle)
    const r = canvas.parentElement.getBoundingClientRect();
    if (Math.abs(r.width - cssW) > 0.5 || Math.abs(r.height - cssH) > 0.5) resizeCanvas();
  }
  function requestDraw() {
    if (frameRequested) return;
    frameRequested = true;
    requestAnimationFrame(() => { frameRequested = false; draw(); });
  }
  // The one gradient-norm scale (views/style.py NORM_BANDS): [name, upper or null, colour],
  // lowest band first, the non-finite band last.
  function normBand(norm) {
    if (norm === null || norm === undefined) return null;
    if (typeof norm === "string" || !isFinite(norm)) return NORM[NORM.length - 1];
    for (let b = 0; b < NORM.length - 1; b++) if (NORM[b][1] === null || norm < NORM[b][1]) return NORM[b];
    return NORM[NORM.length - 2];
  }
  function normColor(norm) { const b = normBand(norm); return b ? b[2] : null; }
  function ratioColor(r) { // a diff's norm ratio: grown over 2x red, shrunk under 0.5x blue
    if (r === null || r === undefined) return null;
    if (typeof r === "string" || !isFinite(r)) return "#c92a2a";
    return r > 2 ? "#c92a2a" : r < 0.5 ? "#1864ab" : "#495057";
  }
  // a numerics page's error band (NUM.scale, the norm scale's colours on error bounds); a
  // finite band's colour is drawn lightened (tint) so that the box's text stays readable
  function errBand(err) {
    const S = NUM.scale;
    if (typeof err === "string" || !isFinite(err)) return S[S.length - 1];
    for (let b = 0; b < S.length - 1; b++) if (S[b][1] === null || err < S[b][1]) return S[b];
    return S[S.length - 2];
  }
  function tint(hex, f) { // hex mixed with white, f of the colour kept
    const n = parseInt(hex.slice(1), 16), mix = (c) => Math.round(255 - (255 - c) * f).toString(16).padStart(2, "0");
    return "#" + mix(n >> 16) + mix((n >> 8) & 255) + mix(n & 255);
  }
  function errColor(err) {
    const b = errBand(err);
    return tint(b[2], b === NUM.scale[NUM.scale.length - 1] ? 0.75 : 0.55);
  }
  const nodeFill = filled(N, null); // a node's colour: its kind and info, which never change
  function fillOf(it) {
    const key = it.key;
    if (key >= SUM) return COLORS.folded;
    if (key >= BOX) return C[key - BOX].kind === "fold" ? COLORS.folded : COLORS.module;
    return nodeFill[key] || (nodeFill[key] = nodeFillOf(key));
  }
  function nodeFillOf(key) {
    const kind = KINDS[nodeKind[key]], info = nodeInfo[key] || {};
    if (info[K.diff]) return DIFF_COLORS[info[K.diff]];
    if (NUM && info[K.numerics]) return errColor(info[K.numerics][NUMF.error]);
    if (info[K.forward_nonfinite]) return COLORS.bad; // the forward made the run's first NaN/Inf here
    if (info[K.nonfinite]) return info[K.first_nonfinite] ? COLORS.bad : COLORS.bad_other;
    if (kind === "module") return info[K.box] && info[K.box][BF.repeat] ? COLORS.folded : COLORS.module;
    if (kind === "output" && info[K.view_base]) return COLORS.base;
    return COLORS[kind] || COLORS.op;
  }
  function hiddenByPath(it) {
    return toggles.pathOnly && related && it.key !== selected && !related.down.has(it.key);
  }
  function edgeHidden(e) {
    if (!toggles.pathOnly || !related) return false;
    const onA = e.a === selected || related.down.has(e.a), onB = e.b === selected || related.down.has(e.b);
    return !(onA && onB);
  }
  function paint(c, v, w, h, opts) {
    c.setTransform(1, 0, 0, 1, 0, 0);
    c.fillStyle = "#fff"; c.fillRect(0, 0, w * opts.scale, h * opts.scale);
    if (!scene) return;
    c.setTransform(v.k * opts.scale, 0, 0, v.k * opts.scale, v.x * opts.scale, v.y * opts.scale);
    const x0 = -v.x / v.k, y0 = -v.y / v.k, x1 = x0 + w / v.k, y1 = y0 + h / v.k;
    const q = query(x0, y0, x1, y1);
    const text = v.k * 11 >= 5;
    const lw = 1 / v.k;
    c.font = FONT; c.textBaseline = "alphabetic";
    // frames
    for (const f of q.f) {
      if (toggles.pathOnly && related) continue;
      const j = f.key - BOX;
      c.fillStyle = C[j].kind === "fold" ? "rgba(255,236,139,0.16)" : "rgba(228,233,246,0.45)";
      c.fillRect(f.x, f.y, f.w, f.h);
      c.strokeStyle = C[j].kind === "fold" ? "#b8a040" : "#8890a8"; c.lineWidth = lw;
      c.setLineDash(C[j].kind === "chunk" ? [2 / v.k, 3 / v.k] : [5 / v.k, 3 / v.k]);
      c.strokeRect(f.x, f.y, f.w, f.h);
      c.setLineDash([]);
      c.fillStyle = C[j].kind === "fold" ? "#f5e7a8" : "#dde3f0";
      c.fillRect(f.x, f.y, f.w, 17);
      if (text) {
        c.fillStyle = "#223";
        const title = frameTitle(j);
        const room = Math.max(1, Math.floor((f.w - 10) / CW));
        c.fillText(title.length > room ? title.slice(0, room - 1) + "…" : title, f.x + 5, f.y + 12);
      }
    }
    // edges
    const arrows = v.k > 0.25;
    for (const e of q.e) {
      if (edgeHidden(e)) continue;
      const col = DIFF ? (e.diff ? DIFF_EDGES[e.diff] : ratioColor(e.ratio)) : normColor(e.norm); // a diff: b/a
      // the selection's inputs (upstream) and its path to the output (downstream) stay bright and
      // thick in their own colours (a norm's colour is never replaced); every other edge fades
      const on = related && (e.b === selected || related.up.has(e.b)) && (e.a === selected || related.up.has(e.a));
      const down = related && (e.a === selected || related.down.has(e.a)) && related.down.has(e.b);
      c.strokeStyle = col || (down || on ? "#222" : "#555");
      c.globalAlpha = related && !on && !down && !toggles.pathOnly ? 0.18 : 1;
      c.lineWidth = (down || on ? 2.4 : 1) * (col === COLORS.bad ? 2 : 1) * lw;
      if (e.view) c.setLineDash([2 / v.k, 3 / v.k]);
      curve(c, e.pts);
      c.stroke();
      c.setLineDash([]);
      if (arrows) arrowHead(c, e.pts, 6 / Math.max(v.k, 0.6));
      const lab = text ? edgeLabel(e) : null;
      if (lab) { c.fillStyle = ratioColor(e.ratio) || col || "#555"; c.fillText(lab.text, lab.x, lab.y + lab.h - 2); }
      c.globalAlpha = 1;
    }
    // boxes
    for (const it of q.n) {
      if (hiddenByPath(it)) continue;
      const dim = related && it.key !== selected && !related.up.has(it.key) && !related.down.has(it.key);
      c.globalAlpha = dim && !toggles.pathOnly ? 0.3 : 1;
      drawItem(c, it, text, lw, v.k);
      c.globalAlpha = 1;
    }
  }
  function drawItem(c, it, text, lw, k) {
    const key = it.key, isBox = key >= BOX;
    c.fillStyle = fillOf(it);
    c.fillRect(it.x, it.y, it.cw, it.h);
    if (k * it.h > 3) {
      let stroke = "#333", width = lw;
      if (!isBox && nodeInfo[key] && nodeInfo[key][K.doctor]) { stroke = DOCTOR_COLOR; width = 3 * lw; }
      if (!isBox && NUM && nodeInfo[key] && nodeInfo[key][K.numerics] && nodeInfo[key][K.numerics][NUMF.diverged]) { stroke = NUM_STROKE; width = 2 * lw; }
      if (key === NUM_FIRST) { stroke = NUM_STROKE; width = 4.5 * lw; }
      if (matches.has(key)) { stroke = "#0a66c2"; width = 2.5 * lw; }
      if (key === selected) { stroke = "#d00"; width = 3 * lw; }
      c.strokeStyle = stroke; c.lineWidth = isBox ? Math.max(width, 2 * lw) : width;
      c.strokeRect(it.x, it.y, it.cw, it.h);
      if (isBox) { // a box of many: a second outline behind it, as Graphviz's box3d
        c.beginPath();
        c.moveTo(it.x + 3, it.y); c.lineTo(it.x + 3, it.y - 3); c.lineTo(it.x + it.cw + 3, it.y - 3);
        c.lineTo(it.x + it.cw + 3, it.y + it.h - 3); c.lineTo(it.x + it.cw, it.y + it.h - 3);
        c.lineWidth = lw; c.strokeStyle = "#555"; c.stroke();
      }
      if (!isBox && KINDS[nodeKind[key]] === "custom") c.strokeRect(it.x + 2, it.y + 2, it.cw - 4, it.h - 4);
    }
    if (text) {
      c.fillStyle = "#111";
      c.textAlign = "center";
      const top = it.y + 11 + textDrop(it) + (isBox ? 1 : 0);
      it.lines.forEach((line, n) => c.fillText(line, it.x + it.cw / 2, top + LH * n));
      c.textAlign = "left";
    }
    if (it.saved) {
      let x = it.x + it.cw + 6;
      const y = it.y + 1;
      c.strokeStyle = "#666"; c.lineWidth = lw;
      const cy = y + 1 + LH; // the middle of the saved boxes, whatever the node's height
      c.beginPath(); c.moveTo(it.x + it.cw, cy); c.lineTo(x, cy); c.stroke();
      for (const s of it.saved) {
        c.fillStyle = s.freed ? COLORS.freed : COLORS.saved;
        c.fillRect(x, y, s.w, 2 + LH * 2);
        c.strokeStyle = "#333"; if (s.freed) c.setLineDash([3 * lw, 2 * lw]);
        c.strokeRect(x, y, s.w, 2 + LH * 2); c.setLineDash([]);
        if (text) {
          c.fillStyle = "#111"; c.textAlign = "center";
          s.lines.forEach((line, n) => c.fillText(line, x + s.w / 2, y + 11 + LH * n));
          c.textAlign = "left";
        }
        x += s.w + 4;
      }
    }
  }
  function fmtRatio(r) {
    if (r === "nan" || r === "inf" || r === "-inf") return "‖∇‖ b/a " + r;
    return "‖∇‖ b/a " + (r >= 100 || r < 0.01 ? r.toExponential(1) : r.toPrecision(3));
  }
  // Edge labels (merged count, gradient norm, a diff's ratio) go where they cover no box and no
  // other label: the first free spot of a few along the edge (its middle, then towards its
  // ends), right of it, then left; placed once per layout.
  function labelText(e) {
    const ratio = e.ratio !== null && e.ratio !== undefined && (typeof e.ratio !== "number" || Math.abs(Math.log(e.ratio)) > 0.01);
    if (ratio) return fmtRatio(e.ratio);
    if (!(e.count > 1 || e.norm !== null)) return "";
    return ((e.count > 1 ? "×" + e.count + " " : "") + (e.norm !== null ? fmtNorm(e.norm) : "")).trim();
  }
  function placeLabels(s) {
    const taken = new Map(); // grid cell -> label boxes placed
    const cells = (r, fn) => {
      for (let cx = Math.floor(r.x / CELL); cx <= Math.floor((r.x + r.w) / CELL); cx++)
        for (let cy = Math.floor(r.y / CELL); cy <= Math.floor((r.y + r.h) / CELL); cy++) if (fn(cx * 100003 + cy)) return true;
      return false;
    };
    const over = (r, x, y, w, h) => r.x < x + w && x < r.x + r.w && r.y < y + h && y < r.y + r.h;
    const hits = (r) => cells(r, (id) => {
      const cell = s.grid.get(id);
      if (cell) for (const it of cell.n) if (over(r, it.x, it.y, it.w, it.h)) return true; // with its saved boxes
      for (const o of taken.get(id) || []) if (over(r, o.x, o.y, o.w, o.h)) return true;
      return false;
    });
    for (const e of s.edges) {
      e.lab = null;
      const text = labelText(e);
      if (!text) continue;
      const p = e.pts, w = CW * text.length + 2, h = LH, last = p.length / 2 - 1;
      const at = (f) => {
        if (p.length <= 4) return [p[0] + (p[2] - p[0]) * f, p[1] + (p[3] - p[1]) * f];
        const n = Math.min(last, Math.max(0, Math.round(f * last)));
        return [p[2 * n], p[2 * n + 1]];
      };
      let first = null;
      for (const f of [0.5, 0.35, 0.65, 0.2, 0.8]) {
        const [x, y] = at(f);
        for (const r of [{ x: x + 4, y: y - h / 2, w, h }, { x: x - 4 - w, y: y - h / 2, w, h }]) {
          if (!first) first = r;
          if (!hits(r)) { e.lab = { text, ...r }; break; }
        }
        if (e.lab) break;
      }
      if (!e.lab) e.lab = { text, ...first, crowded: true };
      const lab = e.lab;
      cells(lab, (id) => { if (!taken.has(id)) taken.set(id, []); taken.get(id).push(lab); return false; });
    }
  }
  function edgeLabel(e) { return e.lab || null; }
  // a box made taller than its text (an op beside its two-line saved boxes): text in the middle
  function textDrop(it) { return it.key < N ? Math.max(0, (it.h - 6 - LH * it.lines.length) / 2) : 0; }
  function curve(c, p) {
    c.beginPath();
    c.moveTo(p[0], p[1]);
    if (p.length <= 4) { c.lineTo(p[2], p[3]); return; }
    for (let q = 2; q < p.length - 2; q += 2) { // through the midpoints: a smooth B-spline-like path
      const mx = (p[q] + p[q + 2]) / 2, my = (p[q + 1] + p[q + 3]) / 2;
      c.quadraticCurveTo(p[q], p[q + 1], mx, my);
    }
    c.lineTo(p[p.length - 2], p[p.length - 1]);
  }
  function arrowHead(c, p, size) {
    const n = p.length;
    const x = p[n - 2], y = p[n - 1];
    let dx = x - p[n - 4], dy = y - p[n - 3];
    const len = Math.hypot(dx, dy) || 1;
    dx /= len; dy /= len;
    c.fillStyle = c.strokeStyle;
    c.beginPath();
    c.moveTo(x, y);
    c.lineTo(x - dx * size - dy * size * 0.45, y - dy * size + dx * size * 0.45);
    c.lineTo(x - dx * size + dy * size * 0.45, y - dy * size - dx * size * 0.45);
    c.closePath(); c.fill();
  }
  function fmtNorm(x) {
    if (x === "nan" || (typeof x === "number" && isNaN(x))) return "nan";
    if (x === "inf" || x === "-inf" || !isFinite(x)) return "inf";
    return x.toExponential(2);
  }
  let lastDrawMs = 0;
  function draw() {
    const t0 = performance.now();
    paint(ctx, view, cssW, cssH, { scale: dpr });
    drawMinimapView();
    lastDrawMs = performance.now() - t0;
  }

  // ------------------------------------------------------------------ minimap
  const mini = $("minimap"), mctx = mini.getContext("2d");
  let miniImage = null, miniX = 1, miniY = 1; // a very tall graph is widened in the minimap
  const MINI_RECTS = 20000;
  function renderMinimap() {
    if (!scene) return;
    const big = scene.bounds.w * 0.6 > cssW || scene.bounds.h * 0.6 > cssH;
    mini.style.display = toggles.minimap && big ? "block" : "none";
    if (mini.style.display === "none") { miniImage = null; return; }
    const W = 180, H = 140;
    const H2 = scene.bounds.h > scene.bounds.w * 4 ? 260 : H; // tall: a taller strip
    miniY = Math.min(W / scene.bounds.w, H2 / scene.bounds.h);
    miniX = Math.max(miniY, Math.min(W / scene.bounds.w, (40 / scene.bounds.w) || miniY)); // >= 40 px wide
    mini.width = Math.ceil(scene.bounds.w * miniX) + 2; mini.height = Math.ceil(scene.bounds.h * miniY) + 2;
    const off = document.createElement("canvas");
    off.width = mini.width; off.height = mini.height;
    const o = off.getContext("2d");
    o.fillStyle = "#fff"; o.fillRect(0, 0, off.width, off.height);
    o.setTransform(miniX, 0, 0, miniY, 1, 1);
    for (const f of scene.frames) { o.fillStyle = "rgba(150,160,190,0.25)"; o.fillRect(f.x, f.y, f.w, f.h); }
    if (scene.nodes.length <= MINI_RECTS) {
      for (const it of scene.nodes) { o.fillStyle = fillOf(it); o.fillRect(it.x, it.y, Math.max(it.w, 2 / miniX), Math.max(it.h, 2 / miniY)); }
    } else { // many boxes: set their pixels (a million fillRect calls take seconds)
      const img = o.getImageData(0, 0, off.width, off.height), W = off.width, H = off.height;
      const px = new Uint8Array(img.data.buffer, img.data.byteOffset, img.data.length);
      const rgb = new Map(), nodes = scene.nodes;
      let last = null, r = 0, g = 0, b = 0; // boxes in a row mostly share their colour
      let lx0 = -1, ly0 = -1, lx1 = -1, ly1 = -1, lcol = null;
      for (let n = 0; n < nodes.length; n++) {
        const it = nodes[n], col = fillOf(it);
        if (col !== last) {
          let c = rgb.get(col);
          if (!c) { c = [parseInt(col.slice(1, 3), 16), parseInt(col.slice(3, 5), 16), parseInt(col.slice(5, 7), 16)]; rgb.set(col, c); }
          last = col; r = c[0]; g = c[1]; b = c[2];
        }
        const x0 = Math.max(0, Math.floor(it.x * miniX + 1)), y0 = Math.max(0, Math.floor(it.y * miniY + 1));
        const x1 = Math.min(W, Math.max(x0 + 2, Math.ceil((it.x + it.w) * miniX + 1)));
        const y1 = Math.min(H, Math.max(y0 + 2, Math.ceil((it.y + it.h) * miniY + 1)));
        // the same pixels in the same colour as the box before (a long chain: thousands a row)
        if (x0 === lx0 && y0 === ly0 && x1 === lx1 && y1 === ly1 && col === lcol) continue;
        lx0 = x0; ly0 = y0; lx1 = x1; ly1 = y1; lcol = col;
        for (let y = y0; y < y1; y++) for (let q = 4 * (y * W + x0), end = 4 * (y * W + x1); q < end; q += 4) {
          px[q] = r; px[q + 1] = g; px[q + 2] = b; px[q + 3] = 255;
        }
      }
      o.putImageData(img, 0, 0);
    }
    miniImage = off;
  }
  function drawMinimapView() {
    if (!miniImage) return;
    mctx.setTransform(1, 0, 0, 1, 0, 0);
    mctx.drawImage(miniImage, 0, 0);
    const x = (-view.x / view.k) * miniX + 1, y = (-view.y / view.k) * miniY + 1;
    mctx.strokeStyle = "#d00"; mctx.lineWidth = 1.5;
    mctx.strokeRect(x, y, (cssW / view.k) * miniX, Math.max(2, (cssH / view.k) * miniY));
  }
  function miniNavigate(ev) {
    const r = mini.getBoundingClientRect();
    const wx = (ev.clientX - r.left - 1) / miniX, wy = (ev.clientY - r.top - 1) / miniY;
    view.x = cssW / 2 - wx * view.k; view.y = cssH / 2 - wy * view.k;
    requestDraw();
  }
  let miniDrag = false;
  mini.addEventListener("mousedown", (ev) => { ev.stopPropagation(); miniDrag = true; miniNavigate(ev); });
  window.addEventListener("mousemove", (ev) => { if (miniDrag) miniNavigate(ev); });
  window.addEventListener("mouseup", () => { miniDrag = false; });

  // ------------------------------------------------------------------ refresh
  let layoutMs = 0, lastLayoutJobs = 0, phases = null, drawnMs = 0;
  function setProgress(done, total) {
    if (total <= 0 || done >= total) { progressEl.hidden = true; return; }
    progressEl.hidden = false;
    progressEl.querySelector("span").textContent = "laying out " + done + " / " + total + " containers";
    progressEl.querySelector("i").style.width = Math.round((100 * done) / total) + "%";
  }
  // Lay out and draw the current state; anchor(scene) then sets the view. Calls made while a
  // layout runs are merged into one more run after it.
  function refresh(anchor) {
    if (busy) {
      again = true;
      const prev = refresh.waiting || [];
      if (anchor) prev.push(anchor);
      refresh.waiting = prev;
      return busy;
    }
    busy = relayout(anchor).catch((err) => { busy = null; showError(err); throw err; });
    return busy;
  }
  // Each step of a refresh is a task of its own (the page keeps responding between them): the
  // visible graph, the layout jobs, the layout (in the worker), placing, then drawing.
  async function relayout(anchor) {
    const gen = ++generation;
    const t0 = performance.now();
    const v = buildView();
    const t1 = performance.now();
    await tick();
    const jobs = makeJobs(v);
    const t2 = performance.now();
    lastLayoutJobs = jobs.jobs.length;
    // (no progress box over a sketch being replaced: the graph is on screen meanwhile)
    const showAfter = replacing ? 0 : setTimeout(() => setProgress(0, jobs.jobs.length), 150);
    const results = await runLayout(jobs.jobs, (p) => setProgress(p[0], p[1]), scene === null);
    clearTimeout(showAfter);
    setProgress(1, 1);
    layoutMs = performance.now() - t0;
    const t3 = performance.now();
    const placed = place(v, jobs, results);
    phases = { build: t1 - t0, jobs: t2 - t1, layout: t3 - t2, place: performance.now() - t3 };
    await tick();
    scene = placed;
    // the selection, its dimming, Path to output and the search marks follow what is drawn now:
    // a selected box that was opened (or a node hidden in a closed one) is no longer selected
    if (selected >= 0) {
      const it = scene.items.get(selected), was = selected;
      if (!it) clearSelection(true);
      else if (it.open) { clearSelection(false); showContainer(was - BOX); } // its frame: details stay
    }
    if (lastFound.length) markMatches(lastFound);
    updateRelated();
    syncSize();
    const settled = anchor ? anchor(scene) : null; // a promise when the view moves smoothly
    renderMinimap();
    draw();
    drawnMs = performance.now() - t0; // the new view is on screen (a zoom may follow)
    updateStatus();
    updateNote();
    busy = null;
    if (again) {
      again = false;
      const waiting = refresh.waiting || [];
      refresh.waiting = [];
      return refresh((sc) => Promise.all(waiting.map((f) => f(sc))));
    }
    await settled;
    return gen;
  }

  // The one-line note: while anything is closed or summarised, every way to see more.
  function updateNote() {
    let hidden = false;
    for (let j = 1; j < M && !hidden; j++) hidden = status[j] !== -1 || (C[j].kind === "fold" && !unfolded[j]);
    const parts = [];
    if (DOCTOR) parts.push(doctorNote());
    if (NUM) parts.push(numNote());
    if (DIFF) parts.push("Diff a → b: " + DIFF.summary + ".");
    if (cropped) parts.push("Shown at a readable size, not whole: drag or use the minimap (bottom right) " +
      "for the rest; f fits it all (too small to read).");
    if (hidden) parts.push("Some modules are closed: click a box to open it, a ×N " +
      "summary to draw every repeat, or Expand all; the command line draws every node with --full " +
      "(or --depth N, --no-fold).");
    noteEl.textContent = parts.join(" ");
  }
  function numNote() { // the comparison's verdict, and what of it has no node here
    let t = "Numerics against the reference: " + NUM.summary;
    if (!NUM.ok && NUM_FIRST < 0) t += " (no node of this graph stands for the first divergence)";
    if (NUM.unmapped) t += " " + NUM.unmapped + " of " + NUM.measured + " ops measured have no node here (no gradient flows through them).";
    return t;
  }
  function doctorNote() { // the doctor's verdict, and the first finding's one line
    const f = DOCTOR.findings[0];
    if (!f) return "Doctor: " + DOCTOR.verdict + ".";
    const more = DOCTOR.findings.length > 1 ? " (" + DOCTOR.verdict + "; Go to finding visits each.)" : "";
    const where = f.nodes.length ? "" : " (no node of this graph stands for it)";
    return "Doctor: " + f.title + ": " + f.message + where + more;
  }
  function showError(err) {
    statusEl.textContent = "layout failed: " + (err && err.message ? err.message : err);
    statusEl.classList.add("error");
  }
  function updateStatus() {
    const shown = scene ? scene.nodes.length : 0;
    statusEl.textContent = shown + " boxes shown for " + N + " nodes · " + D.summary;
  }

  // ------------------------------------------------------------------ view helpers
  function fitRect(x, y, w, h, maxK) {
    const k = Math.max(0.002, Math.min((cssW - 40) / Math.max(w, 1), (cssH - 40) / Math.max(h, 1), maxK || 1.5));
    return { k, x: (cssW - w * k) / 2 - x * k, y: (cssH - h * k) / 2 - y * k };
  }
  function fit() {
    if (!scene) return;
    userMoved = true;
    view = fitRect(0, 0, scene.bounds.w, scene.bounds.h);
    cropped = false; updateNote();
    requestDraw();
  }
  // The views the page opens by itself (first view, after Expand all or Collapse all, a
  // resize): the whole graph when its text is readable so (READ_K), else, at a readable scale,
  // the selection, the first NaN, or the top of the graph (the model's inputs); the minimap
  // and the note say how to reach the rest. Only Fit (asked for) shrinks past it.
  let cropped = false;
  function readableView(s, focus) {
    const whole = fitRect(0, 0, s.bounds.w, s.bounds.h);
    if (whole.k >= READ_K) return { view: whole, cropped: false };
    const k = Math.max(READ_K, Math.min(1, (cssW - 40) / s.bounds.w));
    const it = focus >= 0 ? s.items.get(focus) : null;
    if (it && !it.open) return { view: centerOn(it, k, true), cropped: true };
    let top = null; // the topmost box, leftmost on its row
    for (const n of s.nodes) if (!top || n.y < top.y - 1 || (Math.abs(n.y - top.y) <= 1 && n.x < top.x)) top = n;
    const cx = top ? top.x + top.cw / 2 : s.bounds.w / 2;
    const x = s.bounds.w * k <= cssW - 40 ? (cssW - s.bounds.w * k) / 2
      : Math.min(20, Math.max(cssW - 20 - s.bounds.w * k, cssW / 2 - cx * k));
    return { view: { k, x, y: 20 - (top ? Math.max(0, top.y - 10) : 0) * k }, cropped: true };
  }
  function focusKey() {
    if (selected >= 0) return selected;
    if (doctorTargets.length && scene) return visOf(doctorTargets[0]);
    if (NUM_FIRST >= 0 && scene) return visOf(NUM_FIRST);
    if (D.first >= 0 && scene) return visOf(D.first);
    if (DIFF && scene) { // a diff: the change drawn highest
      let best = null;
      for (const it of scene.nodes) if (it.key < N && nodeInfo[it.key] && nodeInfo[it.key][K.diff] && (!best || it.y < best.y)) best = it;
      if (best) return best.key;
    }
    return -1;
  }
  function firstView() {
    if (!scene) return;
    const r = readableView(scene, focusKey());
    view = r.view; cropped = r.cropped;
    updateNote();
    requestDraw();
  }
  let anim = null;
  function stopAnimation() {
    if (anim) { cancelAnimationFrame(anim); anim = null; }
    if (animDone) { const r = animDone; animDone = null; r(); }
  }
  let animDone = null;
  function animateTo(target, ms) { // resolves once the view has arrived (or another move took over)
    userMoved = true;
    const from = { ...view };
    const t0 = performance.now();
    stopAnimation();
    ms = ms || 220;
    return new Promise((resolve) => {
      animDone = resolve;
      (function step() {
        const t = Math.min(1, (performance.now() - t0) / ms), s = t * (2 - t);
        view = { k: from.k + (target.k - from.k) * s, x: from.x + (target.x - from.x) * s, y: from.y + (target.y - from.y) * s };
        draw();
        if (t < 1) anim = requestAnimationFrame(step);
        else { anim = null; animDone = null; resolve(); }
      })();
    });
  }
  // The opened module zoomed to a readable size: whole when it fits at >= 0.55, else its top
  // at readable scale; the rest of the view follows.
  function showRect(it) {
    const fitK = Math.min((cssW - 40) / it.w, (cssH - 40) / it.h);
    if (fitK >= READ_K) return fitRect(it.x, it.y, it.w, it.h, 1.25);
    const k = Math.max(READ_K, Math.min(1, (cssW - 40) / it.w));
    const x = it.w * k <= cssW - 40 ? cssW / 2 - (it.x + it.w / 2) * k : 20 - it.x * k;
    return { k, x, y: 20 - it.y * k };
  }
  function centerOn(it, minK, exact) {
    const k = exact ? minK : Math.max(view.k, minK || 0.9);
    const w = it.cw || it.w; // an open frame bigger than the view: its top left corner
    return { k, x: w * k > cssW - 40 ? 20 - it.x * k : cssW / 2 - (it.x + w / 2) * k,
             y: it.h * k > cssH - 40 ? 20 - it.y * k : cssH / 2 - (it.y + it.h / 2) * k };
  }

  // ------------------------------------------------------------------ expand and collapse
  function chainOf(j) { const out = []; while (j > 0) { out.push(j); j = C[j].parent; } return out.reverse(); }
  function openTo(j) { // make container j drawn (not hidden in a box or a summary)
    for (const a of chainOf(j)) {
      if (a === j) break;
      if (C[a].kind === "fold" && C[a].members[0] !== memberOf(j, a)) unfolded[a] = 1;
      expanded[a] = 1;
    }
  }
  function memberOf(j, fold) { // the member of fold that contains container j
    for (const a of chainOf(j)) if (C[a].fold === fold) return a;
    return -1;
  }
  function revealNode(i) {
    openTo(nodeC[i]);
    expanded[nodeC[i]] = 1;
    const f = C[nodeC[i]].fold;
    if (f >= 0 && C[f].members[0] !== nodeC[i]) unfolded[f] = 1;
  }
  function screenOf(key) {
    const it = scene && scene.items.get(key);
    return it ? { x: it.x * view.k + view.x, y: it.y * view.k + view.y } : null;
  }
  function expandContainer(j, opts) {
    opts = opts || {};
    const before = screenOf(BOX + j) || (C[j].fold >= 0 ? screenOf(SUM + C[j].fold) : null);
    openTo(j);
    if (C[j].kind === "fold") unfolded[j] = opts.unfold === undefined ? unfolded[j] : opts.unfold ? 1 : 0;
    expanded[j] = 1;
    return refresh((s) => {
      const it = s.items.get(BOX + j);
      if (!it || opts.keepView) return;
      if (before) { // steady: the frame opens where the box was, then zooms to readable size
        view.x = before.x - it.x * view.k; view.y = before.y - it.y * view.k;
      }
      return animateTo(showRect(it));
    });
  }
  function collapseContainer(j) {
    const before = screenOf(BOX + j);
    if (C[j].kind === "fold" && unfolded[j]) unfolded[j] = 0; // fold first, then close
    else expanded[j] = 0;
    if (j === 0) expanded[0] = 1;
    return refresh((s) => {
      const it = s.items.get(BOX + j);
      if (it && before) { view.x = before.x - it.x * view.k; view.y = before.y - it.y * view.k; }
    });
  }
  function unfold(f) {
    const before = screenOf(SUM + f);
    unfolded[f] = 1;
    return refresh((s) => {
      const it = s.items.get(BOX + f);
      if (it && before) { view.x = before.x - it.x * view.k; view.y = before.y - it.y * view.k; }
    });
  }
  function expandAll() {
    expanded.fill(1); unfolded.fill(1);
    return refresh(() => firstView());
  }
  function collapseAll() {
    expanded.fill(0); unfolded.fill(0); expanded[0] = 1;
    return refresh(() => firstView());
  }

  // ------------------------------------------------------------------ selection and details
  function clearSelection(gone) {
    selected = -1; related = null; toggles.pathOnly = false;
    $("path-only").disabled = true; syncToggles();
    if (gone) {
      detailsEl.textContent = "";
      const p = document.createElement("p");
      p.textContent = "The selection is no longer drawn (a module around it was closed): click a node.";
      detailsEl.appendChild(p);
    }
  }
  function updateRelated() {
    if (!scene || selected < 0 || !scene.items.has(selected) || scene.items.get(selected).open) { related = null; return; }
    const walk = (map) => {
      const seen = new Set(), todo = [selected];
      while (todo.length) for (const nxt of map.get(todo.pop()) || []) if (!seen.has(nxt)) { seen.add(nxt); todo.push(nxt); }
      return seen;
    };
    related = { up: walk(adjacencyOf(scene).up), down: walk(adjacencyOf(scene).down) };
    $("path-only").disabled = false;
  }
  function openPanel() { // a selection shows its details: in a frame the folded panel opens
    if (!toggles.panel && embedded && !panelChosen) { toggles.panel = true; syncToggles(); }
  }
  function selectItem(key, opts) {
    selected = key;
    openPanel();
    updateRelated();
    showDetails(key);
    if (opts && opts.center && scene && scene.items.has(key)) return animateTo(centerOn(scene.items.get(key)), 200);
    requestDraw();
    return Promise.resolve();
  }
  function row(table, k, v) {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = k;
    const td = document.createElement("td"); td.textContent = v;
    tr.append(th, td); table.appendChild(tr);
  }
  function section(title, cls) {
    const h = document.createElement("h3"); h.textContent = title; detailsEl.appendChild(h);
    const table = document.createElement("table"); if (cls) table.className = cls;
    detailsEl.appendChild(table);
    return table;
  }
  function header(text) {
    detailsEl.textContent = "";
    const h = document.createElement("h2"); h.textContent = text; detailsEl.appendChild(h);
  }
  function showDetails(key) {
    if (key < 0) { detailsEl.textContent = ""; return; }
    if (key < N) return showNode(key);
    if (key < SUM) return showContainer(key - BOX);
    return showSummary(key - SUM);
  }
  function showNode(i) {
    const info = nodeInfo[i] || {}, kind = KINDS[nodeKind[i]];
    header(nodeName[i] || kind);
    const t = section("node");
    row(t, "id", nodeId[i]);
    row(t, "kind", kind);
    const path = modulePathOf(i);
    row(t, "module", path || "(root)");
    let j = nodeC[i];
    while (j > 0 && C[j].kind !== "module") j = C[j].parent;
    if (j > 0 && C[j].cls) row(t, "class", C[j].cls);
    const tensor = info[K.tensor], box = info[K.box], region = info[K.compiled];
    if (tensor) { row(t, "shape", shapeText(tensor[TF.shape])); row(t, "dtype", tensor[TF.dtype] + " on " + tensor[TF.device]); }
    else if (info[K.shape]) row(t, "output shape", shapeText(info[K.shape]));
    if (info[K.order] !== undefined) row(t, "backward order", "#" + info[K.order] + " (0 ran first)");
    for (const [, key, label] of SHOWN_AS_IS) {
      const v = info[key];
      if (v !== undefined && v !== null) row(t, label, typeof v === "string" ? v : JSON.stringify(v));
    }
    if (box) { row(t, "class", box[BF.cls]); row(t, "nodes", String(box[BF.nodes])); row(t, "saved", fmtBytes(box[BF.saved_bytes])); }
    if (region) row(t, "torch.compile region", region[RF.ops] + " aten ops drawn" + (region[RF.note] ? "; " + region[RF.note] : ""));
    const num = info[K.numerics];
    if (num) {
      const amp = num[NUMF.amplification];
      const s = section(i === NUM_FIRST ? "against the reference: the first divergence" : "against the reference", num[NUMF.diverged] ? "bad" : "");
      row(s, "relative error", fmtErr(num[NUMF.error]) + " (" + errBand(num[NUMF.error])[0] + ")");
      row(s, "amplification", amp === "inf" ? "new: nothing its inputs had explains it" : fmtErr(amp) + "x what its inputs' error and the dtype explain");
      row(s, "verdict", num[NUMF.diverged] ? "beyond tolerance (over " + fmtErr(NUM.threshold) + "x)" : "within tolerance");
      row(s, "worst", num[NUMF.what]);
      if ((num[NUMF.count] || 1) > 1) row(s, "measured here", (num[NUMF.count] || 1) + " (forward and backward ops, or a gradient and its values)");
    }
    if (info[K.forward_nonfinite]) {
      const f = section("non-finite forward", "bad");
      row(f, "forward output", info[K.forward_nonfinite] + ": the first op whose forward output was non-finite");
      if (info[K.created_at]) row(f, "forward line", info[K.created_at]);
    }
    if (info[K.nonfinite]) {
      const b = section("non-finite gradient", "bad");
      row(b, "gradient", info[K.nonfinite] + (info[K.first_nonfinite] ? " (the first in engine order)" : ""));
      if (info[K.created_at] && !info[K.forward_nonfinite]) row(b, "forward line", info[K.created_at]);
    } else if (info[K.created_at] && !info[K.forward_nonfinite]) row(t, "forward line", info[K.created_at]);
    const saved = info[K.saved];
    if (saved && saved.length) {
      const total = saved.reduce((a, s) => a + (s[SF.freed] ? 0 : s[SF.nbytes]), 0);
      const st = section("saved tensors (" + fmtBytes(total) + ")", "saved");
      const head = document.createElement("tr");
      for (const h of ["name", "shape", "dtype", "bytes"]) { const th = document.createElement("th"); th.textContent = h; head.appendChild(th); }
      st.appendChild(head);
      const LIMIT = 300;
      for (const s of saved.slice(0, LIMIT)) {
        const tr = document.createElement("tr");
        const bytes = s[SF.freed] ? "freed" : s[SF.nbytes] + " B (" + fmtBytes(s[SF.nbytes]) + ")";
        for (const val of [s[SF.name], shapeText(s[SF.shape]), s[SF.dtype] || "", bytes]) { const td = document.createElement("td"); td.textContent = val; tr.appendChild(td); }
        st.appendChild(tr);
      }
      if (saved.length > LIMIT) { const p = document.createElement("p"); p.textContent = "… and " + (saved.length - LIMIT) + " more"; detailsEl.appendChild(p); }
    }
    const attrs = info[K.attrs];
    if (attrs) {
      const at = section("attributes");
      for (const k of Object.keys(attrs).sort()) row(at, k, attrs[k]);
    }
    const edges = section("gradient edges");
    let shown = 0;
    for (let k = 0; k < E && shown < 40; k++) {
      if (eSrc[k] !== i && eDst[k] !== i) continue;
      const other = eSrc[k] === i ? eDst[k] : eSrc[k];
      const dir = eSrc[k] === i ? "to input " + eNr[k] : "from consumer";
      row(edges, dir, nodeName[other] + " " + nodeId[other] + (eNorm[k] !== null ? "  ‖∇‖ " + fmtNorm(eNorm[k]) : "") + (eCount[k] > 1 ? " ×" + eCount[k] : ""));
      shown++;
    }
  }
  function showContainer(j) {
    const c = C[j];
    header(c.kind === "chunk" ? c.label : c.path || "(model)");
    const t = section(c.kind === "fold" ? "repeated layers" : c.kind === "chunk" ? "part of a long run" : "module");
    row(t, "kind", { module: "module", fold: "fold (identical consecutive layers)", chunk: "chunk", root: "model" }[c.kind]);
    if (c.kind !== "chunk") row(t, "module", c.path || "(root)");
    else row(t, "nodes from … to", c.range);
    if (c.cls) row(t, "class", c.cls);
    if (c.kind === "fold") row(t, "members", c.members.length + " (" + C[c.members[0]].label + " … " + C[c.members[c.members.length - 1]].label + ")");
    row(t, "nodes", String(c.count));
    row(t, "saved", c.bytes + " B (" + fmtBytes(c.bytes) + ")");
    row(t, "state", status[j] === -1 ? "open (click its title to close)" : "closed (click to open)");
  }
  function showSummary(f) {
    const c = C[f];
    header(summaryLines(f)[0]);
    const t = section("summary of repeated layers");
    row(t, "fold", c.path);
    row(t, "like", C[c.members[0]].path + " (drawn)");
    row(t, "members summarised", String(c.members.length - 1));
    row(t, "nodes", String(c.sumCount));
    row(t, "saved", fmtBytes(c.sumBytes));
    row(t, "open", "click the box to draw every member");
  }

  // ------------------------------------------------------------------ search
  const searchText = filled(N, undefined);
  function haystack(i) {
    if (searchText[i] === undefined) searchText[i] = (nodeName[i] + " " + modulePathOf(i) + " " + nodeId[i]).toLowerCase();
    return searchText[i];
  }
  let searchError = null; // the message of an invalid /regex/, else null
  function findNodes(text) {
    const q = (text || "").trim();
    searchError = null;
    if (!q) return [];
    let test;
    const re = /^\/(.+)\/([a-z]*)$/.exec(q);
    if (re) {
      let rx;
      try { rx = new RegExp(re[1], re[2].includes("i") ? re[2] : re[2] + "i"); }
      catch (err) { searchError = "invalid regex " + q + ": " + (err && err.message ? err.message : err); return []; }
      test = (i) => rx.test(nodeName[i] + " " + modulePathOf(i) + " " + nodeId[i]);
    } else {
      const words = q.toLowerCase().split(/\s+/);
      test = (i) => { const h = haystack(i); return words.every((w) => h.includes(w)); };
    }
    const out = [];
    for (let i = 0; i < N; i++) if (test(i)) out.push(i);
    return out;
  }
  let lastFound = [];
  function markMatches(found) {
    matches = new Set();
    for (const i of found.slice(0, 2000)) { const v = scene ? visOf(i) : i; matches.add(v); }
  }
  function showResults(found) {
    resultsEl.textContent = "";
    lastFound = found;
    markMatches(found);
    const frag = document.createDocumentFragment();
    if (searchError) { const li = document.createElement("li"); li.className = "error"; li.textContent = searchError; frag.appendChild(li); }
    for (const i of found.slice(0, 100)) {
      const li = document.createElement("li");
      li.textContent = nodeName[i] + "  " + (modulePathOf(i) || "") + "  " + nodeId[i];
      li.dataset.id = nodeId[i];
      li.addEventListener("click", () => selectNode(i));
      frag.appendChild(li);
    }
    if (found.length > 100) { const li = document.createElement("li"); li.className = "more"; li.textContent = "… " + (found.length - 100) + " more"; frag.appendChild(li); }
    resultsEl.appendChild(frag);
    requestDraw();
  }
  function selectNode(i) {
    const key = scene ? visOf(i) : -1;
    if (key === i && scene && scene.items.has(i)) return selectItem(i, { center: true });
    revealNode(i);
    return refresh((s) => {
      if (!s.items.has(i)) return;
      selected = i;
      updateRelated();
      view = centerOn(s.items.get(i), 1);
    }).then(() => { showDetails(i); requestDraw(); });
  }
  let searchTimer = null;
  searchEl.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => showResults(findNodes(searchEl.value)), 120);
  });
  searchEl.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") { searchEl.value = ""; showResults([]); searchEl.blur(); return; }
    if (ev.key !== "Enter") return;
    const found = findNodes(searchEl.value);
    showResults(found);
    if (found.length) selectNode(found[0]);
    else detailsEl.textContent = searchError ? searchError[0].toUpperCase() + searchError.slice(1) + "." : "No node matches " + JSON.stringify(searchEl.value) + ".";
  });

  // ------------------------------------------------------------------ pointer input
  function toWorld(ev) {
    const r = canvas.getBoundingClientRect();
    return [(ev.clientX - r.left - view.x) / view.k, (ev.clientY - r.top - view.y) / view.k];
  }
  function hit(wx, wy) {
    const q = query(wx - 2, wy - 2, wx + 2, wy + 2);
    for (const it of q.n) if (!hiddenByPath(it) && wx >= it.x && wx <= it.x + it.w && wy >= it.y && wy <= it.y + it.h) return { item: it };
    for (let n = q.f.length - 1; n >= 0; n--) {
      const f = q.f[n];
      if (wx >= f.x && wx <= f.x + f.w && wy >= f.y && wy <= f.y + 18) return { title: f };
    }
    return null;
  }
  function activate(it) {
    const key = it.key;
    if (key >= SUM) { selected = -1; return unfold(key - SUM); }
    if (key >= BOX) { const j = key - BOX; selected = key; showContainer(j); return expandContainer(j); }
    selectItem(key);
    return Promise.resolve();
  }
  let drag = null, moved = false;
  canvas.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX - view.x, y: ev.clientY - view.y, sx: ev.clientX, sy: ev.clientY };
    moved = false;
    canvas.classList.add("dragging");
  });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    if (Math.abs(ev.clientX - drag.sx) + Math.abs(ev.clientY - drag.sy) > 3) moved = true;
    if (moved) { stopAnimation(); userMoved = true; view.x = ev.clientX - drag.x; view.y = ev.clientY - drag.y; requestDraw(); }
  });
  window.addEventListener("mouseup", (ev) => {
    if (!drag) return;
    canvas.classList.remove("dragging");
    const wasDrag = moved;
    drag = null;
    if (wasDrag || ev.target !== canvas) return;
    const [wx, wy] = toWorld(ev);
    const h = hit(wx, wy);
    if (!h) { clearSelection(false); requestDraw(); return; }
    if (h.item) activate(h.item);
    else { selected = h.title.key; showContainer(h.title.key - BOX); collapseContainer(h.title.key - BOX); }
  });
  canvas.addEventListener("mousemove", (ev) => {
    if (drag) return;
    const [wx, wy] = toWorld(ev);
    const h = hit(wx, wy);
    canvas.title = !h ? "" : h.title ? frameTitle(h.title.key - BOX).slice(2) + " (click to close)"
      : h.item.key >= SUM ? "click to draw every repeat" : h.item.key >= BOX ? "click to open" : nodeName[h.item.key] + " " + nodeId[h.item.key];
    canvas.style.cursor = h ? "pointer" : "";
  });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    stopAnimation();
    userMoved = true;
    const r = canvas.getBoundingClientRect();
    const px = ev.clientX - r.left, py = ev.clientY - r.top;
    const k = Math.min(Math.max(view.k * Math.exp(-ev.deltaY * 0.0015), 0.005), 8);
    view.x = px - ((px - view.x) * k) / view.k;
    view.y = py - ((py - view.y) * k) / view.k;
    view.k = k;
    requestDraw();
  }, { passive: false });
  new ResizeObserver(() => { // resize keeps the view: the same point stays in the middle
    const cx = (cssW / 2 - view.x) / view.k, cy = (cssH / 2 - view.y) / view.k;
    resizeCanvas();
    if (scene && !userMoved) firstView();
    else if (scene) { view.x = cssW / 2 - cx * view.k; view.y = cssH / 2 - cy * view.k; }
    if (scene) renderMinimap();
    draw();
  }).observe(canvas.parentElement);

  // ------------------------------------------------------------------ keyboard
  function neighbour(dir) {
    if (!scene || selected < 0) return -1;
    const it = scene.items.get(selected);
    if (!it) return -1;
    let list;
    if (dir === "up") list = adjacencyOf(scene).up.get(selected) || [];
    else if (dir === "down") list = adjacencyOf(scene).down.get(selected) || [];
    else {
      const sibs = scene.view.direct.get(it.parent).map((k) => scene.items.get(k)).filter((s) => !s.open)
        .sort((p, q) => (Math.abs(p.y - it.y) < 10 ? p.x - q.x : p.y - q.y));
      const n = sibs.indexOf(it);
      const next = sibs[n + (dir === "right" ? 1 : -1)];
      return next ? next.key : -1;
    }
    let best = -1, bestD = Infinity;
    for (const k of list) {
      const o = scene.items.get(k);
      const d = Math.hypot(o.x - it.x, o.y - it.y);
      if (d < bestD) { bestD = d; best = k; }
    }
    return best;
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.target === searchEl || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const keys = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right" };
    if (keys[ev.key]) {
      ev.preventDefault();
      if (selected < 0 && scene && scene.nodes.length) { selectItem(scene.nodes[0].key, { center: true }); return; }
      const n = neighbour(keys[ev.key]);
      if (n >= 0) selectItem(n, { center: true });
      return;
    }
    if (ev.key === "Enter" && selected >= 0 && scene && scene.items.has(selected)) { ev.preventDefault(); activate(scene.items.get(selected)); }
    else if (ev.key === "Backspace" && selected >= 0 && scene) {
      const it = scene.items.get(selected);
      if (it && it.parent > 0) { ev.preventDefault(); const j = it.parent; selected = BOX + j; collapseContainer(j); }
    } else if (ev.key === "Escape") { clearSelection(false); requestDraw(); }
    else if (ev.key === "/") { ev.preventDefault(); searchEl.focus(); }
    else if (ev.key === "f") fit();
    else if (ev.key === "+" || ev.key === "=") zoomBy(1.25);
    else if (ev.key === "-") zoomBy(0.8);
    else if (ev.key === "p" && selected >= 0) { toggles.pathOnly = !toggles.pathOnly; syncToggles(); requestDraw(); }
    else if (ev.key === "n" && D.first >= 0) goFirst();
  });
  function zoomBy(f) {
    const k = Math.min(Math.max(view.k * f, 0.005), 8);
    view.x = cssW / 2 - ((cssW / 2 - view.x) * k) / view.k; view.y = cssH / 2 - ((cssH / 2 - view.y) * k) / view.k; view.k = k;
    requestDraw();
  }

  // ------------------------------------------------------------------ export
  function download(blob, name) {
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url; a.download = name; document.body.appendChild(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
  function exportPng() {
    const off = document.createElement("canvas");
    const scale = 2;
    off.width = Math.round(cssW * scale); off.height = Math.round(cssH * scale);
    paint(off.getContext("2d"), view, cssW, cssH, { scale });
    off.toBlob((b) => download(b, "gradscope-view.png"));
  }
  function esc(s) { return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;"); }
  function viewSvg() { // the current view as SVG text (what is inside the window)
    const x0 = -view.x / view.k, y0 = -view.y / view.k, w = cssW / view.k, h = cssH / view.k;
    const q = query(x0, y0, x0 + w, y0 + h);
    const out = [`<svg xmlns="http://www.w3.org/2000/svg" viewBox="${x0.toFixed(1)} ${y0.toFixed(1)} ${w.toFixed(1)} ${h.toFixed(1)}" width="${Math.round(cssW)}" height="${Math.round(cssH)}" font-family="monospace" font-size="11">`];
    out.push(`<rect x="${x0}" y="${y0}" width="${w}" height="${h}" fill="#fff"/>`);
    for (const f of q.f) {
      const j = f.key - BOX;
      out.push(`<rect x="${f.x}" y="${f.y}" width="${f.w}" height="${f.h}" fill="#eef1f8" fill-opacity="0.5" stroke="#8890a8" stroke-dasharray="5 3"/>`);
      out.push(`<text x="${f.x + 5}" y="${f.y + 12}">${esc(frameTitle(j))}</text>`);
    }
    for (const e of q.e) {
      if (edgeHidden(e)) continue;
      let d = "M" + e.pts[0] + " " + e.pts[1];
      for (let k = 2; k < e.pts.length; k += 2) d += " L" + e.pts[k] + " " + e.pts[k + 1];
      out.push(`<path d="${d}" fill="none" stroke="${normColor(e.norm) || "#555"}"${e.view ? ' stroke-dasharray="2 3"' : ""}/>`);
    }
    for (const it of q.n) {
      if (hiddenByPath(it)) continue;
      out.push(`<rect x="${it.x}" y="${it.y}" width="${it.cw}" height="${it.h}" fill="${fillOf(it)}" stroke="#333"/>`);
      it.lines.forEach((line, n) => out.push(`<text x="${it.x + it.cw / 2}" y="${it.y + 11 + textDrop(it) + LH * n}" text-anchor="middle">${esc(line)}</text>`));
      if (it.saved) {
        let x = it.x + it.cw + 6;
        for (const s of it.saved) {
          out.push(`<rect x="${x}" y="${it.y + 1}" width="${s.w}" height="${2 + LH * 2}" fill="${s.freed ? COLORS.freed : COLORS.saved}" stroke="#333"/>`);
          s.lines.forEach((line, n) => out.push(`<text x="${x + s.w / 2}" y="${it.y + 12 + LH * n}" text-anchor="middle">${esc(line)}</text>`));
          x += s.w + 4;
        }
      }
    }
    out.push("</svg>");
    return out.join("\n");
  }

  // ------------------------------------------------------------------ legend
  function buildLegend() {
    const el = $("legend");
    const sw = (fill, label, extra) => `<div class="row"><span class="sw${extra ? " " + extra : ""}" style="background:${fill}"></span>${label}</div>`;
    const parts = ["<b>Legend</b>",
      sw(COLORS.op, "op (backward node)"), sw(COLORS.leaf, "leaf: parameter, input"),
      sw(COLORS.custom, "custom Function", "double"), sw(COLORS.output, "output"),
      sw(COLORS.saved, "saved tensor (Saved)"), sw(COLORS.base, "output, a view's base"),
      sw(COLORS.module, "module: click to open", "box"), sw(COLORS.folded, "repeats: one drawn", "box"),
      `<div class="row"><span class="sw frame"></span>open module: title closes</div>`,
      `<div class="row"><span class="ln dotted"></span>view → its base</div>`,
      ...(hasSavedEdges ? [`<div class="row"><span class="ln dotted"></span>saved activation (compiled)</div>`] : []),
      `<div class="row"><span class="ln"></span><span class="cnt">×3</span> merged edges</div>`];
    if (OPT.backward && !DIFF) {
      parts.push(sw(COLORS.bad, "first NaN/Inf"), sw(COLORS.bad_other, "later NaN/Inf"),
        `<div class="row">#N: backward order</div>`,
        `<div class="row wide">edge colour: ‖∇‖ of the gradient along it (as in SVG and tree)</div>`);
      let lower = null;
      const num = (v) => (v < 0.01 || v >= 1000 ? v.toExponential(0).replace("e+", "e") : String(v));
      for (const [name, upper, color] of NORM) {
        const range = name === "non-finite" ? "NaN or Inf" : lower === null ? "< " + num(upper) : upper === null ? "≥ " + num(lower) : num(lower) + " – " + num(upper);
        parts.push(`<div class="row"><span class="ln" style="border-top:2.5px solid ${color}"></span>${name}: ${range}</div>`);
        if (upper !== null) lower = upper;
      }
    }
    if (DOCTOR && doctorTargets.length) {
      parts.push(`<div class="row"><span class="sw" style="background:#fff;border:2.5px solid ${DOCTOR_COLOR}"></span>⚑ a doctor's finding</div>`);
    }
    if (NUM) { // the error bands (numbers and names of page_data.py ERROR_BANDS, never a model's)
      parts.push("<b>Relative error against the reference</b>");
      let lower = null;
      const last = NUM.scale.length - 1;
      NUM.scale.forEach(([name, upper], b) => {
        const range = b === last ? "only one run finite" : lower === null ? "< " + fmtErr(upper) : upper === null ? "≥ " + fmtErr(lower) : fmtErr(lower) + " – " + fmtErr(upper);
        parts.push(sw(tint(NUM.scale[b][2], b === last ? 0.75 : 0.55), name + ": " + range));
        if (upper !== null) lower = upper;
      });
      parts.push(`<div class="row"><span class="sw" style="background:#fff;border:3px solid ${NUM_STROKE}"></span>◆ first divergence (thin: later ones)</div>`,
        `<div class="row wide">err · Nx: error, and N times what its inputs and dtype explain (over ${fmtErr(NUM.threshold)}x diverges)</div>`);
    }
    if (DIFF) {
      parts.push("<b>Diff: a → b</b>", sw(DIFF_COLORS.added, "added in b"), sw(DIFF_COLORS.removed, "removed from a"),
        sw(DIFF_COLORS.changed, "changed: shape, dtype, saved"),
        `<div class="row"><span class="ln" style="border-top:2.5px solid ${DIFF_EDGES.added}"></span>edge added</div>`,
        `<div class="row"><span class="ln" style="border-top:2.5px solid ${DIFF_EDGES.removed}"></span>edge removed</div>`,
        `<div class="row wide"><span class="ln" style="border-top:2.5px solid #c92a2a"></span>‖∇‖ b/a over 2 (or NaN/Inf), <span style="color:#1864ab">under 0.5</span></div>`);
    }
    el.innerHTML = parts.join("");
  }

  // ------------------------------------------------------------------ controls
  function syncToggles() {
    for (const [id, key] of [["t-saved", "saved"], ["t-shapes", "shapes"], ["t-legend", "legend"], ["t-minimap", "minimap"], ["path-only", "pathOnly"], ["t-panel", "panel"]]) {
      const b = $(id);
      b.setAttribute("aria-pressed", toggles[key] ? "true" : "false");
    }
    $("legend").hidden = !toggles.legend;
    document.body.classList.toggle("folded", !toggles.panel);
    document.body.classList.toggle("narrow", embedded || window.innerWidth < 1000);
    if (selected < 0) $("path-only").disabled = true;
  }
  function toggle(key, relayout) {
    toggles[key] = !toggles[key];
    if (key === "legend" || key === "panel") keepPref(key, toggles[key]);
    if (key === "panel") panelChosen = true;
    if (key === "legend" && toggles.legend && !toggles.panel) { toggles.panel = true; keepPref("panel", true); }
    labelState++;
    syncToggles();
    if (relayout) {
      const c = scene ? { x: (cssW / 2 - view.x) / view.k, y: (cssH / 2 - view.y) / view.k } : null;
      return refresh(() => { if (c) { view.x = cssW / 2 - c.x * view.k; view.y = cssH / 2 - c.y * view.k; } });
    }
    if (key === "minimap") renderMinimap();
    requestDraw();
    return Promise.resolve();
  }
  $("t-saved").addEventListener("click", () => toggle("saved", true));
  $("t-shapes").addEventListener("click", () => toggle("shapes", true));
  $("t-legend").addEventListener("click", () => toggle("legend", false));
  $("t-panel").addEventListener("click", () => toggle("panel", false));
  $("t-minimap").addEventListener("click", () => toggle("minimap", false));
  $("path-only").addEventListener("click", () => { if (selected >= 0) toggle("pathOnly", false); });
  $("fit").addEventListener("click", fit);
  $("expand-all").addEventListener("click", () => askExpandAll());
  // Past SMOOTH nodes, Expand all says what it will draw and how long that takes, and waits
  // for a yes: drawing a million boxes is seconds of layout and a heap of a gigabyte.
  const SMOOTH = 30000;
  let asking = null;
  function askExpandAll() {
    if (N <= SMOOTH) return expandAll();
    if (asking) return asking;
    const perNode = Math.max(0.02, scene && scene.nodes.length ? layoutMs / scene.nodes.length : 0.05);
    const secs = Math.max(1, Math.round((N * perNode) / 1000));
    const box = document.createElement("div");
    box.id = "ask";
    box.textContent = "Expand all draws all " + N.toLocaleString("en") + " nodes: about " + secs +
      " s of layout and much memory; search (/) or opening boxes one by one is lighter. ";
    const yes = document.createElement("button"); yes.textContent = "Draw all " + N.toLocaleString("en");
    const no = document.createElement("button"); no.textContent = "Cancel";
    box.append(yes, " ", no);
    noteEl.after(box);
    box.style.cssText = "grid-row: 2; grid-column: 1 / 3; padding: 4px 10px; background: #fff3bf; font-size: 12px;";
    asking = new Promise((resolve) => {
      const done = (go) => { box.remove(); asking = null; resolve(go ? expandAll() : false); };
      yes.addEventListener("click", () => done(true));
      no.addEventListener("click", () => done(false));
    });
    return asking;
  }
  $("collapse-all").addEventListener("click", () => collapseAll());
  $("export-png").addEventListener("click", exportPng);
  $("export-svg").addEventListener("click", () => download(new Blob([viewSvg()], { type: "image/svg+xml" }), "gradscope-view.svg"));
  function goFinding() { // the next node of the doctor's findings, in order, round again
    if (!doctorTargets.length) return Promise.resolve();
    const i = doctorTargets[doctorNext % doctorTargets.length];
    doctorNext++;
    return selectNode(i);
  }
  if (doctorTargets.length) {
    const b = $("go-finding");
    b.hidden = false;
    b.addEventListener("click", goFinding);
  }
  function goDivergence() { return NUM_FIRST >= 0 ? selectNode(NUM_FIRST) : Promise.resolve(); }
  if (NUM_FIRST >= 0) {
    const b = $("go-divergence");
    b.hidden = false;
    b.addEventListener("click", goDivergence);
  }
  function goFirst() { return D.first >= 0 ? selectNode(D.first) : Promise.resolve(); }
  if (D.first >= 0) {
    const b = $("first-bad");
    b.hidden = false;
    const fi = nodeInfo[D.first] || {};
    b.textContent = "Go to first " + ((fi[K.forward_nonfinite] || fi[K.nonfinite]) === "inf" ? "Inf" : "NaN");
    b.addEventListener("click", goFirst);
  }

  // ------------------------------------------------------------------ the first view
  function initialState() {
    openBudget();
    if (NUM_FIRST >= 0) revealNode(NUM_FIRST); // a numerics page opens on its first divergence
  }
  function openBudget() {
    const noDepth = OPT.depth === null || OPT.depth === undefined;
    if (OPT.full || (noDepth && N <= OPT.budget && !OPT.fold_always)) { expanded.fill(1); unfolded.fill(1); return; }
    if (OPT.depth !== null && OPT.depth !== undefined) {
      for (const c of C) if (c.kind === "module" && c.depth < OPT.depth) expanded[c.j] = 1;
      for (const c of C) if (c.kind === "fold" && c.depth <= OPT.depth) expanded[c.j] = 1;
    }
    // breadth-first, open what fits the budget (a folded fold costs two boxes)
    const budget = OPT.budget;
    computeStatus();
    let shown = 0;
    for (const j of ORDER) if (status[j] === -1) shown += directCount(j) - (j === 0 ? 0 : 1);
    const queue = [0];
    for (let q = 0; q < queue.length; q++) {
      const j = queue[q];
      for (const k of drawnKids(j)) {
        if (status[k] === -1) { queue.push(k); continue; }
        if (OPT.depth !== null && OPT.depth !== undefined && C[k].kind === "module" && C[k].depth >= OPT.depth) continue;
        const cost = directCount(k) - 1;
        if (shown + cost > budget) continue;
        expanded[k] = 1; shown += cost;
        computeStatus();
        queue.push(k);
      }
    }
  }
  // A first view too big to read whole (a GPT-2's hundreds of ops fill the budget) opens as
  // the overview instead: the top-level boxes, then one more level at a time while the whole
  // graph stays readable (READ_K). Not when the page was asked for a depth or --full, or has a
  // place to show first (a NaN, a doctor's finding, a diff's change), or the user has moved.
  const OVERVIEW_LEVELS = 8, OVERVIEW_NODES = 200; // a small graph keeps its own first view
  function readableWhole() {
    return !!scene && fitRect(0, 0, scene.bounds.w, scene.bounds.h).k >= READ_K;
  }
  function closedFrontier() { // the closed containers drawn as boxes in an open one
    computeStatus();
    const out = [];
    for (const j of ORDER) {
      if (j === 0 || status[j] !== BOX + j || expanded[j]) continue;
      if (C[j].kids.length || C[j].nodes.length > 1) out.push(j);
    }
    return out;
  }
  async function overviewFirst() {
    const noDepth = OPT.depth === null || OPT.depth === undefined;
    if (!scene || N < OVERVIEW_NODES || userMoved || OPT.full || !noDepth || focusKey() >= 0 ||
        !C.some((c) => c.kind === "module") || readableWhole()) return; // (a bare chain: its runs)
    expanded.fill(0); unfolded.fill(0); expanded[0] = 1;
    overview = true;
    await refresh(() => firstView());
    for (let level = 0; level < OVERVIEW_LEVELS && readableWhole() && !userMoved; level++) {
      const open = closedFrontier();
      if (!open.length) break;
      const kept = expanded.slice();
      for (const j of open) expanded[j] = 1;
      await refresh(() => firstView());
      if (!readableWhole() && !userMoved) { // one level too many: back to the last readable one
        expanded.set(kept);
        await refresh(() => firstView());
        break;
      }
    }
  }
  function firstViewItems() { // the boxes the first view will draw (before it is built)
    computeStatus();
    let items = 0;
    for (const j of ORDER) if (status[j] === -1) items += directCount(j);
    return items;
  }
  function drawnKids(j) {
    const c = C[j];
    if (c.kind === "fold" && !unfolded[j]) return [c.members[0]];
    return c.kids;
  }
  function directCount(j) {
    const c = C[j];
    if (c.kind === "fold" && !unfolded[j]) return 2;
    return c.nodes.length + c.kids.length;
  }

  function measure() {
    ctx.font = FONT;
    const w = ctx.measureText("MMMMMMMMMM").width / 10;
    if (w > 3 && w < 12) CW = w;
  }

  // ------------------------------------------------------------------ window.gradscope
  function findContainer(path) {
    if (byPath.has(path)) return byPath.get(path);
    for (const c of C) if (c.label === path || (c.kind === "fold" && c.path + " x" + c.members.length === path)) return c.j;
    return -1;
  }
  // the id the API gives a drawn item: a node's id, "box:path" for a module, "sum:path" for a fold
  function itemId(key) { return key < N ? nodeId[key] : key < SUM ? "box:" + C[key - BOX].path : "sum:" + C[key - SUM].path; }
  const api = {
    version: 2,
    visible: () => (scene ? scene.nodes.length : 0),
    expand(path) {
      const j = findContainer(path);
      if (j < 0) return Promise.reject(new Error("no module " + JSON.stringify(path)));
      return expandContainer(j, { unfold: C[j].kind === "fold" ? true : undefined }).then(() => undefined);
    },
    collapse(path) {
      const j = findContainer(path);
      if (j < 0) return Promise.reject(new Error("no module " + JSON.stringify(path)));
      expanded[j] = 0; if (C[j].kind === "fold") unfolded[j] = 0;
      if (j === 0) expanded[0] = 1;
      return refresh(null).then(() => undefined);
    },
    expandAll: () => expandAll().then(() => undefined),
    collapseAll: () => collapseAll().then(() => undefined),
    search(text) { const found = findNodes(text); showResults(found); return found.map((i) => nodeId[i]); },
    searchError: () => searchError,
    // what the drawing says now: the selection, whether the rest is dimmed, Path to output
    state: () => ({ selected: api.selected(), dimmed: !!related, pathOnly: toggles.pathOnly, note: noteEl.textContent }),
    select(id) {
      const i = idIndex(id);
      if (i !== undefined) return selectNode(i).then(() => undefined);
      const j = findContainer(String(id).replace(/^box:/, ""));
      if (j < 0) return Promise.reject(new Error("no node " + JSON.stringify(id)));
      openTo(j);
      return refresh((s) => { if (s.items.has(BOX + j)) { selected = BOX + j; updateRelated(); view = centerOn(s.items.get(BOX + j), 0.9); } })
        .then(() => { showContainer(j); requestDraw(); });
    },
    details: () => detailsEl.innerText,
    firstNonfinite: () => (D.first >= 0 ? nodeId[D.first] : null),
    // a numerics page (gs.trace_divergence): the node of the first divergence, and going there
    firstDivergence: () => (NUM_FIRST >= 0 ? nodeId[NUM_FIRST] : null),
    goToDivergence: () => goDivergence().then(() => api.selected()),
    // the doctor's findings on this page (--doctor): title and [role, node id] of each node
    findings: () => (DOCTOR ? DOCTOR.findings.map((f) => ({ title: f.title, message: f.message, nodes: f.nodes.map(([r, i]) => [r, nodeId[i]]) })) : null),
    goToFinding: () => goFinding().then(() => api.selected()),
    selected: () => (selected < 0 ? null : itemId(selected)),
    toggle: (name) => (name in toggles ? toggle(name, name === "saved" || name === "shapes") : Promise.reject(new Error("no toggle " + name))),
    exportSvg: () => viewSvg(),
    stats: () => ({ readyMs, drawnMs, timings: T, phases, bounds: scene ? scene.bounds : null, layoutMs, jobs: lastLayoutJobs, drawMs: lastDrawMs, worker: !!worker, boxes: scene ? scene.nodes.length : 0, frames: scene ? scene.frames.length : 0, edges: scene ? scene.edges.length : 0, gridEntries: scene ? scene.gridEntries : 0, longEdges: scene ? scene.long.length : 0, overview }),
    view: () => ({ ...view, width: cssW, height: cssH }),
    // What is drawn, in page coordinates: boxes [id, x, y, w, h, w with the saved boxes beside
    // it], edges {a, b (item keys), from, to (their ids), pts, label}.
    geometry: () => (scene ? {
      boxes: scene.nodes.map((it) => [itemId(it.key), it.x, it.y, it.cw || it.w, it.h, it.w]),
      edges: scene.edges.map((e) => ({ a: e.a, b: e.b, from: itemId(e.a), to: itemId(e.b), pts: Array.from(e.pts), label: edgeLabel(e) })),
    } : null),
    boxAt(id) { // where a node (or "box:path") is drawn now, in CSS pixels of the canvas
      let key = idIndex(id);
      if (key === undefined) { const j = findContainer(String(id).replace(/^box:/, "")); key = j < 0 ? -1 : BOX + j; }
      const it = scene && scene.items.get(key);
      return it ? { x: it.x * view.k + view.x, y: it.y * view.k + view.y, w: (it.cw || it.w) * view.k, h: it.h * view.k } : null;
    },
  };
  let resolveReady, readyMs = null;
  api.ready = new Promise((r) => { resolveReady = r; });
  window.gradscope = api;

  // ------------------------------------------------------------------ start
  measure();
  resizeCanvas();
  buildLegend();
  syncToggles();
  T.setup = performance.now();
  // (window.__gsNoSketch: benchmarks/viewer.py --screenshot measures the page without it)
  quick = N <= SKETCH_NODES && E <= 2 * SKETCH_NODES && !window.__gsNoSketch;
  loadParts().then(() => {
    T.loaded = performance.now();
    initialState();
    if (NUM_FIRST >= 0) showDetails(NUM_FIRST); // what diverged, in the panel from the start
    T.initial = performance.now();
    if (quick && firstViewItems() > SKETCH_ITEMS) quick = false; // too many boxes for one task
    return refresh(() => firstView());
  }).then(() => {
    quick = false;
    if (!sketched) return null;
    T.sketched = performance.now();
    sketched = false; // the sketch is drawn: now the real layout (the view follows unless moved)
    replacing = true;
    return refresh(() => { if (!userMoved) firstView(); });
  }).then(() => {
    replacing = false;
    return overviewFirst();
  }).then(() => {
    readyMs = performance.now(); // since the navigation started
    resolveReady();
  }, (err) => { quick = false; showError(err); });
})();
