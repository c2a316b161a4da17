// gradscope's layout core: lays out containers one at a time with dagre (vendored, see
// README.md here). It runs in a Web Worker (built by viewer.js from a Blob of this script and
// dagre's, so the page stays one file) and, where a worker cannot start, on the main thread in
// short slices. A job is one container's direct items; an item that is itself an open container
// refers to an earlier job, whose laid-out size (plus its frame's padding) is the item's size.
// So no dagre call sees more than one container's direct contents, and identical containers
// (the 64 layers of an encoder) are laid out once: results are cached by their exact input.
(function (root) {
  "use strict";
  const cache = new Map(); // exact layout input -> result
  const MAX_CACHE = 20000;

  // job: {w: [..], h: [..], c: [itemIndex, jobIndex, ...], e: [a0, b0, a1, b1, ...],
  //       pad: [left, top, right, bottom]} (pad: the frame drawn around this job when it is a
  //       child of another). result: {w, h, x: [..], y: [..] (item top-left), p: [[x0, y0, ...]]}
  let last = null; // the job laid out before, and its result
  function layoutOne(job, results) {
    // the very arrays of the job before (viewer.js gives a job alike to the one before them):
    // the same input, so the same result
    if (last && job.c.length === 0 && last.job.c.length === 0 && job.w === last.job.w && job.h === last.job.h && job.e === last.job.e) return last.result;
    const result = layoutFresh(job, results);
    last = { job, result };
    return result;
  }
  function layoutFresh(job, results) {
    const n = job.w.length;
    const w = job.w.slice(), h = job.h.slice();
    for (let k = 0; k < job.c.length; k += 2) {
      const r = results[job.c[k + 1]];
      const pad = job.pads[job.c[k + 1]];
      w[job.c[k]] = r.w + pad[0] + pad[2];
      h[job.c[k]] = r.h + pad[1] + pad[3];
    }
    let key = n + "|";
    for (let i = 0; i < n; i++) key += Math.round(w[i]) + "," + Math.round(h[i]) + ";";
    key += "|" + job.e.join(",");
    const hit = cache.get(key);
    if (hit) return hit;
    const result = n > 0 ? run(n, w, h, job.e) : { w: 0, h: 0, x: [], y: [], p: [] };
    if (cache.size > MAX_CACHE) cache.clear();
    cache.set(key, result);
    return result;
  }

  function run(n, w, h, e) {
    const g = new root.dagre.graphlib.Graph({ multigraph: false });
    g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 26, edgesep: 8, marginx: 0, marginy: 0 });
    g.setDefaultEdgeLabel(() => ({}));
    for (let i = 0; i < n; i++) g.setNode(String(i), { width: w[i], height: h[i] });
    for (let k = 0; k < e.length; k += 2) g.setEdge(String(e[k]), String(e[k + 1]));
    root.dagre.layout(g);
    const x = new Array(n), y = new Array(n);
    let minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
    for (let i = 0; i < n; i++) {
      const v = g.node(String(i));
      x[i] = v.x - w[i] / 2; y[i] = v.y - h[i] / 2;
      minX = Math.min(minX, x[i]); minY = Math.min(minY, y[i]);
      maxX = Math.max(maxX, x[i] + w[i]); maxY = Math.max(maxY, y[i] + h[i]);
    }
    const raw = [];
    for (let k = 0; k < e.length; k += 2) {
      const pts = g.edge(String(e[k]), String(e[k + 1])).points || [];
      raw.push(pts);
      for (const q of pts) { // routes can bulge past the boxes: keep them inside the frame
        minX = Math.min(minX, q.x); minY = Math.min(minY, q.y);
        maxX = Math.max(maxX, q.x); maxY = Math.max(maxY, q.y);
      }
    }
    const p = raw.map((pts) => {
      const flat = [];
      for (const q of pts) flat.push(Math.round((q.x - minX) * 10) / 10, Math.round((q.y - minY) * 10) / 10);
      return flat;
    });
    for (let i = 0; i < n; i++) { x[i] -= minX; y[i] -= minY; }
    return { w: maxX - minX, h: maxY - minY, x, y, p };
  }

  // A layout task over many jobs, run in slices: step(ms) works for about ms milliseconds and
  // says whether it is done; progress() is [jobs done, jobs].
  function task(jobs) {
    const results = new Array(jobs.length);
    const pads = jobs.map((j) => j.pad);
    let next = 0;
    return {
      step(ms) {
        const end = Date.now() + ms;
        while (next < jobs.length) {
          const job = jobs[next];
          job.pads = pads;
          results[next] = layoutOne(job, results);
          next++;
          if (Date.now() >= end) break;
        }
        return next >= jobs.length;
      },
      progress() { return [next, jobs.length]; },
      results,
    };
  }

  // A sketch of the same jobs, in one pass over each (no dagre, no cache): ranks by the
  // longest path from the sources (a cycle broken at its lowest item), each rank in item order,
  // centred; edges as straight lines between the boxes. The page draws it before the load event
  // when the first view is too big to lay out in that task, so a picture taken at load
  // (``chromium --headless --screenshot``) shows the graph; the real layout replaces it.
  function sketchOne(job, results) {
    const n = job.w.length, w = job.w.slice(), h = job.h.slice(), e = job.e;
    for (let k = 0; k < job.c.length; k += 2) {
      const r = results[job.c[k + 1]], pad = job.pads[job.c[k + 1]];
      w[job.c[k]] = r.w + pad[0] + pad[2];
      h[job.c[k]] = r.h + pad[1] + pad[3];
    }
    const indeg = new Int32Array(n), start = new Int32Array(n + 1), rank = new Int32Array(n);
    for (let k = 0; k < e.length; k += 2) { start[e[k] + 1]++; indeg[e[k + 1]]++; }
    for (let i = 0; i < n; i++) start[i + 1] += start[i];
    const out = new Int32Array(e.length / 2), fill = start.slice(0, n);
    for (let k = 0; k < e.length; k += 2) out[fill[e[k]]++] = e[k + 1];
    const done = new Uint8Array(n), queue = [];
    for (let i = 0; i < n; i++) if (indeg[i] === 0) queue.push(i);
    let next = 0, low = 0;
    while (next < n) {
      if (next === queue.length) { // a cycle: go on from its lowest item not placed yet
        while (done[low]) low++;
        indeg[low] = -1; queue.push(low);
      }
      const i = queue[next++];
      done[i] = 1;
      for (let q = start[i]; q < start[i + 1]; q++) {
        const j = out[q];
        if (done[j]) continue;
        if (rank[j] < rank[i] + 1) rank[j] = rank[i] + 1;
        if (--indeg[j] === 0) queue.push(j);
      }
    }
    let ranks = 0;
    for (let i = 0; i < n; i++) ranks = Math.max(ranks, rank[i] + 1);
    const rowW = new Float64Array(ranks), rowH = new Float64Array(ranks);
    for (let i = 0; i < n; i++) {
      rowW[rank[i]] += w[i] + (rowW[rank[i]] > 0 ? 14 : 0);
      rowH[rank[i]] = Math.max(rowH[rank[i]], h[i]);
    }
    let width = 0;
    for (let r = 0; r < ranks; r++) width = Math.max(width, rowW[r]);
    const rowY = new Float64Array(ranks), cursor = new Float64Array(ranks);
    let height = 0;
    for (let r = 0; r < ranks; r++) { rowY[r] = height; height += rowH[r] + 26; cursor[r] = (width - rowW[r]) / 2; }
    const x = new Array(n), y = new Array(n);
    for (let i = 0; i < n; i++) {
      const r = rank[i];
      x[i] = cursor[r]; cursor[r] += w[i] + 14;
      y[i] = rowY[r] + (rowH[r] - h[i]) / 2;
    }
    const p = [];
    for (let k = 0; k < e.length; k += 2) {
      const a = e[k], b = e[k + 1];
      p.push([x[a] + w[a] / 2, y[a] + h[a], x[b] + w[b] / 2, y[b]].map((v) => Math.round(v * 10) / 10));
    }
    return { w: width, h: Math.max(0, height - 26), x, y, p };
  }
  function sketch(jobs) {
    const pads = jobs.map((j) => j.pad), results = new Array(jobs.length);
    jobs.forEach((job, k) => { job.pads = pads; results[k] = sketchOne(job, results); });
    return results;
  }

  root.gsLayout = { task, sketch, cacheSize: () => cache.size };

  // In a worker: answer {id, jobs} with {id, started} at once (the page falls back to its main
  // thread when no answer comes), then progress messages, then {id, results}.
  if (typeof root.document === "undefined" && typeof root.postMessage === "function") {
    root.onmessage = (ev) => {
      const { id, jobs } = ev.data;
      root.postMessage({ id, started: true });
      const t = task(jobs);
      const t0 = Date.now();
      while (!t.step(100)) root.postMessage({ id, progress: t.progress() });
      root.postMessage({ id, results: t.results, ms: Date.now() - t0 });
    };
  }
})(typeof self !== "undefined" ? self : this);
