/* TorchLens viewer: lays out and toggles the view model that torchlens.viz.page computed.
 * It never re-derives the hierarchy or the folds: calls, groups, titles and lines come from the
 * JSON; this file only decides what is open, places it (dagre, one small layout per open
 * module, cached) and paints it. No network: everything it needs is in this page. */
(function () {
  "use strict";
  const ALL = JSON.parse(document.getElementById("torchlens-data").textContent);
  // a step run: one graph per distinct op graph, each step's own times and shapes; a step of
  // another graph is shown by reopening the page on it (#step=N)
  const STEPS = ALL.steps || null;
  const asked = STEPS ? +((location.hash.match(/step=(\d+)/) || [])[1] ?? STEPS.current) : 0;
  const stepPos = STEPS && asked >= 0 && asked < STEPS.rows.length ? asked : STEPS ? STEPS.current : 0;
  const D = STEPS ? STEPS.graphs[STEPS.rows[stepPos].graph] : ALL;
  const O = D.ops, C = D.calls, G = D.groups, T = D.theme;
  const N = O.label.length;
  const PAD = 10, HEAD = 18, FAN = 3, NS = "http://www.w3.org/2000/svg";
  const S = {
    expanded: new Set(D.start.expanded), unfolded: new Set(D.start.unfolded),
    rolled: D.start.rolled, colorBy: D.metric ? "metric" : "", selected: null, pinned: false, hits: [], hit: -1,
    labels: true, view: { x: 0, y: 0, k: 1 },
  };
  const BASE = STEPS ? { shape: O.shape.slice(), lines: O.lines.map((l) => l.slice()) } : null;
  function applyStep(pos) { // this step's own op times and the shapes that differ
    const row = STEPS.rows[pos];
    O.time_ns = row.time_ns.slice();
    for (let i = 0; i < N; i++) { O.shape[i] = BASE.shape[i]; O.lines[i] = BASE.lines[i].slice(); }
    for (const k in row.shapes) {
      const old = BASE.shape[k], now = row.shapes[k];
      O.shape[k] = now;
      O.lines[k] = BASE.lines[k].map((l) => (old ? l.replace(old, now) : l));
    }
    S.step = pos;
  }
  const children = Array.from({ length: N }, () => []);
  const rollCount = new Array(N).fill(1);
  for (let i = 0; i < N; i++) {
    for (const p of O.parents[i]) children[p].push(i);
    if (O.alias[i] >= 0 && O.group[i] < 0) rollCount[O.alias[i]]++;
  }
  const hasRolls = G.some((g) => g.kind === "roll") || rollCount.some((n) => n > 1);
  const layoutCache = new Map();
  let tree = null, units = null, edges = null;

  // ---- what is visible -----------------------------------------------------------------------
  function closed(g) {
    if (g < 0) return S.rolled;
    return G[g].kind === "fold" ? !S.unfolded.has(g) : S.rolled;
  }
  function open(g) {
    if (g < 0 || G[g].kind === "roll") S.rolled = false; else S.unfolded.add(g);
  }
  function resolve(i) {
    for (let k = 0; k < 64 && O.alias[i] >= 0 && closed(O.group[i]); k++) i = O.alias[i];
    return i;
  }
  const hiddenCall = (c) => C[c].member_of >= 0 && closed(C[c].member_of);
  const isOpen = (c) => S.expanded.has(c) && !C[c].atomic;
  const foldedGroup = (c) => (C[c].group >= 0 && closed(C[c].group) ? G[C[c].group] : null);

  function unitOf(i) {
    const r = resolve(i);
    for (const c of O.stack[r]) {
      if (C[c].atomic) break;
      if (!isOpen(c)) return "c" + c;
    }
    return "o" + r;
  }

  function opCount(r) {
    const stack = O.stack[r], c = stack[stack.length - 1];
    let n = 1;
    if (c !== undefined && C[c].atomic && foldedGroup(c)) n = foldedGroup(c).count;
    if (S.rolled) n = Math.max(n, rollCount[r]);
    return n;
  }

  function makeNode(id, parent) {
    const node = { kind: "node", id, parent };
    if (id[0] === "o") {
      const r = +id.slice(1), n = opCount(r);
      node.op = r;
      node.title = O.label[r] + (n > 1 ? " ×" + n : "");
      node.lines = O.lines[r];
      node.cls = O.kind[r] + (n > 1 ? " folded" : "") + (O.edited[r] != null ? " edited" : "") +
        (O.dinfo && O.dinfo[r] && O.dinfo[r].status !== "matched" ? " d-" + O.dinfo[r].status : "");
      node.fill = O.kind[r] === "input" ? T.input_fill : O.kind[r] === "output" ? T.output_fill
        : n > 1 ? T.fold_fill : T.node_fill;
      const m = O.module[r];
      node.address = m ? m.slice(0, m.lastIndexOf(":")) : "";
    } else {
      const c = +id.slice(1), g = foldedGroup(c);
      node.call = c;
      node.title = g ? g.title : C[c].title;
      node.lines = g ? g.lines : C[c].lines;
      node.cls = "module" + (g ? " folded" : "") + (!g && C[c].edited ? " edited" : "");
      node.fill = g ? T.fold_fill : T.module_fill;
      node.address = C[c].address;
    }
    return node;
  }

  function visit(items, parent, out, depth) {
    for (const it of items) {
      if (it >= 0) {
        if (resolve(it) === it) out.push(makeNode("o" + it, parent));
        continue;
      }
      const c = -it - 1;
      if (hiddenCall(c)) continue;
      if (C[c].atomic) { visit(C[c].items, parent, out, depth); continue; }
      if (!isOpen(c)) { out.push(makeNode("c" + c, parent)); continue; }
      const g = foldedGroup(c);
      const cl = {
        kind: "cluster", id: "k" + c, call: c, parent, kids: [], depth,
        title: g ? g.cluster : C[c].cluster, folded: !!g, synthetic: C[c].kind !== "module",
        address: C[c].address,
      };
      visit(C[c].items, cl, cl.kids, depth + 1);
      if (cl.kids.length) out.push(cl);
    }
    return out;
  }

  function build() {
    tree = { kind: "cluster", id: "root", parent: null, kids: [], depth: 0 };
    visit(D.root, tree, tree.kids, 1);
    units = new Map();
    (function index(cl) {
      for (const k of cl.kids) {
        units.set(k.id, k);
        if (k.kind === "cluster") index(k);
      }
    })(tree);
    edges = [];
    const seen = new Set();
    for (let i = 0; i < N; i++) {
      const head = unitOf(i);
      for (const p of O.parents[i]) {
        const a = O.run[p], b = O.run[i];
        if (a && b && a[0] === b[0] && a[1] !== b[1] && closed(a[0])) continue; // the ×N chain
        const tail = unitOf(p);
        if (tail === head || seen.has(tail + ">" + head)) continue;
        seen.add(tail + ">" + head);
        if (units.has(tail) && units.has(head)) edges.push({ tail, head, label: O.shape[p] });
      }
    }
    for (const e of edges) lift(e);
  }

  function chain(u) {
    const out = [];
    for (let c = units.get(u).parent; c; c = c.parent) out.unshift(c);
    return out;
  }

  function lift(e) { // the edge as the innermost layout holding both ends sees it
    const a = chain(e.tail), b = chain(e.head);
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    e.scope = a[n - 1];
    e.lt = n < a.length ? a[n].id : e.tail;
    e.lh = n < b.length ? b[n].id : e.head;
    (e.scope.ledges || (e.scope.ledges = new Set())).add(e.lt + ">" + e.lh);
  }

  // ---- layout --------------------------------------------------------------------------------
  const ctx = document.createElement("canvas").getContext("2d");
  function textWidth(text, font) { ctx.font = font; return ctx.measureText(text).width; }
  const FONT = "11px -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";
  const BOLD = "600 " + FONT, SMALL = "9.5px -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";

  function size(node) {
    let w = textWidth(node.title, BOLD);
    for (const line of node.lines) w = Math.max(w, textWidth(line, SMALL));
    node.w = q8(w + 16);
    node.h = 20 + 12 * node.lines.length;
  }

  const q8 = (v) => Math.ceil(v / 8) * 8; // sizes on a grid, so identical blocks share layouts

  function layout(cl) {
    for (const k of cl.kids) (k.kind === "cluster" ? layout : size)(k);
    const index = new Map(cl.kids.map((k, i) => [k.id, i]));
    const pairs = [], fan = new Map(); // a tensor read all over (a mask fed to every block)
    for (const key of cl.ledges || []) { // ranks nothing: lay out only its first few edges,
      const [t, h] = key.split(">"); // so long edges cannot flood the layout with bends
      const n = (fan.get(t) || 0) + 1;
      fan.set(t, n);
      if (n <= FAN) pairs.push(index.get(t) + ">" + index.get(h));
    }
    // what the layout depends on, and nothing else: kid sizes (and insides), edges by position
    const sig = cl.kids.map((k) => k.w + "x" + k.h + (k.sig ? "[" + k.sig + "]" : "")).join(",") +
      "|" + pairs.join(",");
    let done = layoutCache.get(sig);
    if (!done) {
      const g = new dagre.graphlib.Graph();
      g.setGraph({ rankdir: D.direction, nodesep: 16, ranksep: 24, marginx: 0, marginy: 0 });
      g.setDefaultEdgeLabel(() => ({}));
      cl.kids.forEach((k, i) => g.setNode(String(i), { width: k.w, height: k.h }));
      for (const pair of pairs) { const [t, h] = pair.split(">"); g.setEdge(t, h); }
      dagre.layout(g);
      done = { pos: [], points: {}, w: g.graph().width || 0, h: g.graph().height || 0 };
      cl.kids.forEach((k, i) => { const n = g.node(String(i)); done.pos.push([n.x - k.w / 2, n.y - k.h / 2]); });
      for (const e of g.edges()) done.points[e.v + ">" + e.w] = g.edge(e).points;
      layoutCache.set(sig, done);
    }
    cl.lay = done;
    cl.index = index;
    cl.sig = sig.length < 2000 ? sig : "#" + hashOf(sig);
    const head = cl.id === "root" ? 0 : HEAD;
    const pad = cl.id === "root" ? 0 : PAD;
    cl.w = q8(Math.max(done.w, cl.title ? textWidth(cl.title, BOLD) + 12 : 0) + 2 * pad);
    cl.h = done.h + 2 * pad + head;
  }

  function hashOf(text) { // short stand-in for a long signature (FNV-1a, two seeds)
    let a = 2166136261, b = 5381;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      a = Math.imul(a ^ c, 16777619);
      b = Math.imul(b, 33) ^ c;
    }
    return (a >>> 0).toString(36) + (b >>> 0).toString(36) + text.length;
  }

  function place(cl, x, y) {
    cl.x = x; cl.y = y;
    const head = cl.id === "root" ? 0 : HEAD, pad = cl.id === "root" ? 0 : PAD;
    cl.ox = x + pad; cl.oy = y + pad + head;
    for (const k of cl.kids) {
      const [rx, ry] = cl.lay.pos[cl.index.get(k.id)];
      if (k.kind === "cluster") place(k, cl.ox + rx, cl.oy + ry); else { k.x = cl.ox + rx; k.y = cl.oy + ry; }
    }
  }

  function clip(box, toward) { // where the line from the box centre to `toward` leaves the box
    const cx = box.x + box.w / 2, cy = box.y + box.h / 2;
    const dx = toward.x - cx, dy = toward.y - cy;
    if (!dx && !dy) return { x: cx, y: cy };
    const s = Math.min(Math.abs((box.w / 2) / (dx || 1e-9)), Math.abs((box.h / 2) / (dy || 1e-9)));
    return { x: cx + dx * s, y: cy + dy * s };
  }

  function route(e) {
    const sc = e.scope, key = sc.index.get(e.lt) + ">" + sc.index.get(e.lh);
    e.far = !sc.lay.points[key]; // one of a hub's many edges, left out of the layout
    const pts = (sc.lay.points[key] || []).map((p) => ({ x: p.x + sc.ox, y: p.y + sc.oy }));
    const t = units.get(e.tail), h = units.get(e.head);
    if (!pts.length) pts.push(clip(t, center(h)), clip(h, center(t)));
    if (e.lt !== e.tail) pts.unshift(clip(t, pts[0]));
    if (e.lh !== e.head) pts.push(clip(h, pts[pts.length - 1]));
    return pts;
  }
  const center = (b) => ({ x: b.x + b.w / 2, y: b.y + b.h / 2 });

  function pathOf(pts) {
    let d = "M" + pts[0].x.toFixed(1) + "," + pts[0].y.toFixed(1);
    for (let i = 1; i < pts.length - 1; i++) {
      const m = { x: (pts[i].x + pts[i + 1].x) / 2, y: (pts[i].y + pts[i + 1].y) / 2 };
      d += "Q" + pts[i].x.toFixed(1) + "," + pts[i].y.toFixed(1) + " " + m.x.toFixed(1) + "," + m.y.toFixed(1);
    }
    const z = pts[pts.length - 1];
    return d + "L" + z.x.toFixed(1) + "," + z.y.toFixed(1);
  }

  // ---- colour --------------------------------------------------------------------------------
  const METRICS = { time_ns: "time", flops: "FLOPs", params: "parameters", bytes: "output bytes", metric: D.metric || "" };
  const RAMP = T.name === "dark" ? ["#3d2611", "#b35c1e", "#ffb26b"] : ["#fff1e0", "#fd8d3c", "#a63603"];
  function metric(u, key) { // a magnitude: gradients and overlays may be negative
    const g = u.op === undefined ? foldedGroup(u.call) : null;
    const v = u.op !== undefined ? O[key][u.op] : g ? g[key] : C[u.call][key];
    return key === "metric" && v !== null && v !== undefined ? Math.abs(v) : v;
  }
  function hex(c) { return [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)); }
  function mix(a, b, t) {
    const x = hex(a), y = hex(b);
    return "#" + x.map((v, i) => Math.round(v + (y[i] - v) * t).toString(16).padStart(2, "0")).join("");
  }
  function ramp(t) { return t < 0.5 ? mix(RAMP[0], RAMP[1], t * 2) : mix(RAMP[1], RAMP[2], t * 2 - 1); }
  function scale(nodes) {
    const vals = nodes.map((n) => metric(n, S.colorBy)).filter((v) => v !== null && v !== undefined && v > 0);
    if (!vals.length) return null;
    return { lo: Math.log10(Math.min(...vals)), hi: Math.log10(Math.max(...vals)), min: Math.min(...vals), max: Math.max(...vals) };
  }
  function fmt(v, key) {
    if (v === null || v === undefined) return "—";
    if (key === "metric") return Math.abs(v) >= 1e30 ? "inf/nan" : v.toExponential(2);
    if (key === "time_ns") return v >= 1e6 ? (v / 1e6).toFixed(2) + " ms" : (v / 1e3).toFixed(1) + " µs";
    if (key === "bytes") return v >= 1 << 20 ? (v / (1 << 20)).toFixed(2) + " MiB" : v >= 1024 ? (v / 1024).toFixed(1) + " KiB" : v + " B";
    for (const [n, s] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]]) if (v >= n) return (v / n).toFixed(1) + s;
    return String(v);
  }

  // ---- painting ------------------------------------------------------------------------------
  const esc = (s) => String(s).replace(/[&<>"]/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[ch]);

  function paintCluster(cl, out) {
    const fill = cl.folded ? T.fold_fill : T.cluster_fills[(cl.depth - 1) % T.cluster_fills.length];
    out.push(`<g class="cluster${cl.folded ? " folded" : ""}${cl.synthetic ? " synthetic" : ""}" data-id="${cl.id}" data-address="${esc(cl.address)}">` +
      `<rect x="${cl.x}" y="${cl.y}" width="${cl.w}" height="${cl.h}" rx="6" fill="${fill}"/>` +
      `<text class="head" data-id="${cl.id}" x="${cl.x + 8}" y="${cl.y + 13}">${esc(cl.title)} ▾</text></g>`);
    for (const k of cl.kids) if (k.kind === "cluster") paintCluster(k, out);
  }

  function paintNode(n, sc, out) {
    let fill = n.fill;
    if (sc) {
      const v = metric(n, S.colorBy);
      if (v > 0) fill = ramp(sc.hi > sc.lo ? (Math.log10(v) - sc.lo) / (sc.hi - sc.lo) : 1);
    }
    const [r, g, b] = hex(fill), dark = (0.299 * r + 0.587 * g + 0.114 * b) / 255 < 0.5;
    const lines = n.lines.map((l, i) => `<text class="sub" x="${n.x + 8}" y="${n.y + 27 + 12 * i}">${esc(l)}</text>`).join("");
    out.push(`<g class="node ${n.cls}${dark ? " dark" : " light"}" data-id="${n.id}" data-address="${esc(n.address)}" data-title="${esc(n.title)}">` +
      `<rect x="${n.x}" y="${n.y}" width="${n.w}" height="${n.h}" rx="${n.call !== undefined ? 2 : 5}" fill="${fill}"/>` +
      `<text x="${n.x + 8}" y="${n.y + 14}" font-weight="600">${esc(n.title)}</text>${lines}</g>`);
  }

  function render() {
    const t0 = performance.now();
    build();
    const t1 = performance.now();
    layout(tree);
    place(tree, 0, 0);
    const t2 = performance.now();
    const nodes = [...units.values()].filter((u) => u.kind === "node");
    const sc = S.colorBy ? scale(nodes) : null;
    const out = [];
    for (const k of tree.kids) if (k.kind === "cluster") paintCluster(k, out);
    out.push(`<g class="edges${S.labels ? "" : " nolabels"}">`);
    for (const e of edges) {
      const pts = route(e), mid = pts[Math.floor(pts.length / 2)];
      out.push(`<g class="edge${e.far ? " far" : ""}"><path d="${pathOf(pts)}"${e.far ? "" : ' marker-end="url(#arrow)"'}/>` +
        (e.label && !e.far ? `<text x="${mid.x + 4}" y="${mid.y}">${esc(e.label)}</text>` : "") + "</g>");
    }
    out.push("</g>");
    for (const n of nodes) paintNode(n, sc, out);
    el.scene.innerHTML = out.join("");
    legend(sc);
    mark();
    if (document.activeElement !== el.depth) el.depth.value = shownDepth();
    el.count.textContent = nodes.length + " nodes";
    const t3 = performance.now();
    window.torchlens.last_render_ms = t3 - t0;
    window.torchlens.timings = { build: t1 - t0, layout: t2 - t1, paint: t3 - t2 };
  }

  function shownDepth() { // the depth box's number: "Expand to depth" with it opens what is open
    let n = C.length ? 1 : 0; // now (1: the outermost modules, each one box)
    for (const c of S.expanded) if (C[c] && !C[c].atomic) n = Math.max(n, C[c].depth + 1);
    return n;
  }

  function legend(sc) {
    if (!S.colorBy) { el.legend.innerHTML = ""; return; }
    el.legend.innerHTML = `<b>${METRICS[S.colorBy]}</b>` + (sc
      ? `<div class="ramp" style="background:linear-gradient(90deg,${RAMP.join(",")})"></div>` +
        `<div class="ends"><span>${fmt(sc.min, S.colorBy)}</span><span>log scale</span><span>${fmt(sc.max, S.colorBy)}</span></div>`
      : "<div>no values</div>") +
      `<div><span class="none" style="background:${T.node_fill}"></span>${S.colorBy === "metric" && D.diff ? "equal, or not compared" : "no value"}</div>` +
      (D.diff ? `<div class="diffkey"><span class="d-added"></span>only in ${esc(D.diff.b)} <span class="d-removed"></span>only in ${esc(D.diff.a)}</div>` +
        (D.diff.first_op !== null && D.diff.first_op !== undefined ? `<div>first divergence: <a data-op="${D.diff.first_op}">${esc(D.diff.first)}</a></div>` : "<div>no divergence</div>") : "");
  }

  // ---- search --------------------------------------------------------------------------------
  function typeOf(i) { // the class of the module this op is all of (conv2d_3 is a Conv2d)
    const s = O.stack[i], c = s[s.length - 1];
    return c !== undefined && C[c].atomic ? C[c].type : "";
  }
  // the site vocabulary of save= and edits= (torchlens.sites): an op label (every pass) or a
  // pass label, a module address or one call of it ("layer1.0:2"), a glob over module addresses
  // ("*" within one part, "**" across dots); null when the query names no site
  function moduleHits(match, pass, hits) {
    for (let c = 0; c < C.length; c++) {
      if (C[c].kind !== "module" || !match(C[c].address) || (pass !== null && C[c].pass !== pass)) continue;
      if (C[c].atomic) { const f = firstOp(c); if (f >= 0) hits.push(f); } else hits.push(-c - 1);
    }
  }
  // a transformer name (blocks.3.hook_resid_post, or a glob over them): the ops they stand on
  function nameHits(q) {
    const names = D.names || {}, re = /[*?]/.test(q) ? new RegExp("^" + q.split(/(\*)/).map((p) =>
      p === "*" ? "[^.]*" : p.replace(/[.+^${}()|[\]\\?]/g, "\\$&")).join("") + "$") : null;
    const labels = Object.keys(names).filter((n) => re ? re.test(n) : n === q).map((n) => names[n]);
    const hits = [];
    for (let i = 0; i < N; i++) if (labels.includes(O.label[i].split(":")[0])) hits.push(i);
    return hits.length ? hits : null;
  }
  function siteHits(q) {
    const named = nameHits(q);
    if (named) return named;
    const hits = [];
    if (/[*?]/.test(q)) {
      const re = new RegExp("^" + q.split(/(\*\*|\*|\?)/).map((p) => p === "**" ? ".*" : p === "*"
        ? "[^.]*" : p === "?" ? "[^.]" : p.replace(/[.+^${}()|[\]\\]/g, "\\$&")).join("") + "$");
      moduleHits((a) => re.test(a), null, hits);
      return hits;
    }
    for (let i = 0; i < N; i++) if (O.label[i] === q || O.label[i].split(":")[0] === q) hits.push(i);
    if (hits.length) return hits;
    const k = q.lastIndexOf(":"), pass = k > 0 && /^\d+$/.test(q.slice(k + 1)) ? +q.slice(k + 1) : null;
    const address = pass === null ? q : q.slice(0, k);
    moduleHits((a) => a === address, pass, hits);
    return hits.length ? hits : null;
  }
  function search(q) {
    const exact = q.trim() ? siteHits(q.trim()) : null;
    q = q.trim().toLowerCase();
    S.hits = exact || [];
    S.hit = -1;
    if (q && !exact) {
      for (let i = 0; i < N; i++) {
        const m = O.module[i].toLowerCase();
        if (O.label[i].toLowerCase().includes(q) || O.func[i].toLowerCase().includes(q) ||
            m.slice(0, m.lastIndexOf(":")).includes(q) || typeOf(i).toLowerCase().includes(q)) S.hits.push(i);
      }
      for (let c = 0; c < C.length; c++) {
        if (C[c].kind !== "module" || C[c].atomic) continue;
        if (C[c].address.toLowerCase().includes(q) || C[c].type.toLowerCase().includes(q)) S.hits.push(-c - 1);
      }
    }
    if (S.hits.length) next(); else { render(); el.hits.textContent = q ? "no match" : ""; }
  }
  function firstOp(c) {
    for (const it of C[c].items) { if (it >= 0) return it; const f = firstOp(-it - 1); if (f >= 0) return f; }
    return -1;
  }
  function reveal(i, upto) { // make op i (or its call `upto`) visible: open folds, expand modules
    for (let k = 0; k < 64 && O.alias[i] >= 0 && closed(O.group[i]); k++) open(O.group[i]);
    for (const c of O.stack[i]) {
      if (C[c].member_of >= 0 && closed(C[c].member_of)) open(C[c].member_of);
      if (c === upto) break;
      S.expanded.add(c);
    }
  }
  function hitUnit(h) {
    if (h >= 0) return unitOf(h);
    const c = -h - 1;
    if (units.has("c" + c)) return "c" + c;
    if (units.has("k" + c)) return "k" + c;
    return unitOf(firstOp(c));
  }
  function next() {
    S.hit = (S.hit + 1) % S.hits.length;
    const h = S.hits[S.hit];
    if (h >= 0) reveal(h); else reveal(firstOp(-h - 1), -h - 1);
    render();
    const u = units.get(hitUnit(h));
    if (u) { focus(u); select(u.id, true); }
  }
  function mark() {
    if (!S.hits.length) return;
    const current = hitUnit(S.hits[S.hit]);
    const lit = new Set(S.hits.map(hitUnit));
    for (const id of lit) {
      const g = el.scene.querySelector(`[data-id="${id}"]`);
      if (g) g.classList.add("hit");
    }
    const g = el.scene.querySelector(`g[data-id="${current}"]`);
    if (g) g.classList.add("current");
    el.hits.textContent = `${S.hit + 1} of ${S.hits.length}`;
  }

  // ---- details -------------------------------------------------------------------------------
  function row(k, v) { return `<tr><td>${k}</td><td>${v}</td></tr>`; }
  function link(i) { return `<a data-op="${i}">${esc(O.label[i])}</a>`; }
  function diffRows(d) { // both sides of a diffed op, and how far apart
    const a = D.diff.a, b = D.diff.b, t = d.text;
    let h = row("diff", `<b>${esc(d.status)}</b>` + (d.changes.length ? ": " + esc(d.changes.join("; ")) : "")) +
      row(esc(a), d.a === null ? "— (absent)" : `${esc(d.a)} · <span class="shape">${esc(d.shape_a)}</span> ${esc(d.dtype_a)}`) +
      row(esc(b), d.b === null ? "— (absent)" : `${esc(d.b)} · <span class="shape">${esc(d.shape_b)}</span> ${esc(d.dtype_b)}`);
    if (d.values !== "compared") return h + row("values", esc(d.values));
    return h + row("max abs diff", t.max_abs) + row("relative diff", t.relative) + row("cosine", t.cosine) +
      row("outside tol.", (100 * d.outside).toPrecision(3) + "%");
  }
  function details(id) {
    const u = units.get(id);
    if (!u) { el.details.innerHTML = ""; return; }
    let h;
    if (u.op !== undefined) {
      const i = u.op, m = O.module[i];
      h = `<h2>${esc(O.label[i])}</h2><table>` + row("function", esc(O.func[i])) + row("kind", O.kind[i]) +
        row("module", m ? esc(m.slice(0, m.lastIndexOf(":"))) + " · pass " + m.slice(m.lastIndexOf(":") + 1) : "— (model level)") +
        row("output", `<span class="shape">${esc(O.shape[i] || "—")}</span> ${esc(O.dtype[i])}`) +
        row("params", fmt(O.params[i], "params")) + row("FLOPs", fmt(O.flops[i], "flops")) +
        row("time", fmt(O.time_ns[i], "time_ns")) + row("bytes", fmt(O.bytes[i], "bytes")) +
        (D.metric && !D.diff ? row(esc(D.metric), fmt(O.metric[i], "metric")) : "") +
        row("parents", O.parents[i].map(link).join(" ") || "—") + row("children", children[i].map(link).join(" ") || "—") +
        (O.dinfo && O.dinfo[i] ? diffRows(O.dinfo[i]) : "") + "</table>";
    } else {
      const c = u.call, g = C[c].group >= 0 ? G[C[c].group] : null, folded = g && closed(C[c].group);
      const src = folded ? g : C[c];
      h = `<h2>${esc(folded ? g.title : C[c].address)}</h2><table>` + row("type", esc(C[c].type)) +
        row("call", esc(C[c].key)) + (folded ? row("stands for", g.count + " calls") : "") +
        row("output", `<span class="shape">${esc(C[c].shape || "—")}</span>`) + row("ops", src.ops) +
        row("params", fmt(src.params, "params")) + row("FLOPs", fmt(src.flops, "flops")) +
        row("time", fmt(src.time_ns, "time_ns")) + row("bytes", fmt(src.bytes, "bytes")) +
        (D.metric ? row("largest " + esc(D.metric), fmt(src.metric, "metric")) : "") + "</table>";
      const buttons = [];
      if (folded) buttons.push(`<button data-act="unfold" data-call="${c}">${g.kind === "fold" ? "Unfold" : "Unroll"} into ${g.count} calls</button>`);
      else if (g && g.kind === "fold") buttons.push(`<button data-act="fold" data-group="${C[c].group}">Fold back ×${g.count}</button>`);
      if (C[c].member_of >= 0) buttons.push(`<button data-act="fold" data-group="${C[c].member_of}">Fold back ×${G[C[c].member_of].count}</button>`);
      buttons.push(isOpen(c) ? `<button data-act="collapse" data-call="${c}">Collapse</button>`
        : `<button data-act="expand" data-call="${c}">Expand</button>`);
      h += buttons.join(" ");
    }
    const li = attnLayerOf(id);
    if (li >= 0) h += ` <button data-act="attention" data-layer="${li}">Attention pattern</button>`;
    el.details.innerHTML = h;
  }
  function select(id, pin) {
    S.selected = id;
    S.pinned = pin;
    for (const g of el.scene.querySelectorAll(".selected")) g.classList.remove("selected");
    const g = el.scene.querySelector(`g[data-id="${id}"]`);
    if (g) g.classList.add("selected");
    details(id);
    if (pin && attnLayerOf(id) >= 0) showAttention(attnLayerOf(id)); // an attention op or module
  }

  // ---- attention patterns ---------------------------------------------------------------------
  // the trace's saved blocks.{L}.attn.hook_pattern (torchlens.viz.attention.page_patterns): per
  // layer [head][query][key] integers (value / A.scale), batch row 0, at most 64 positions
  const A = D.attention && D.attention.layers.length ? D.attention : null;
  const ARAMP = ["#f7fbff", "#6baed6", "#08306b"];
  function attnColour(v) {
    if (v === null) return "#d0d7de";
    const t = Math.min(1, Math.max(0, v));
    return t < 0.5 ? mix(ARAMP[0], ARAMP[1], t * 2) : mix(ARAMP[1], ARAMP[2], t * 2 - 1);
  }
  function attnLayerOf(id) { // the pattern a unit stands for: its attention op, or that op's module
    if (!A || !id) return -1;
    const u = units.get(id);
    if (!u) return -1;
    if (u.op !== undefined) {
      const label = O.label[u.op];
      return A.layers.findIndex((l) => l.op === label || l.op === label.split(":")[0]);
    }
    return A.layers.findIndex((l) => l.module && l.module === u.address);
  }
  function axis(n) { // the tokens when the input has as many, else positions
    return Array.from({ length: n }, (_, i) => A.tokens && A.n_tokens === n && i < A.tokens.length ? A.tokens[i] : String(i));
  }
  const short = (t) => (t.length > 12 ? t.slice(0, 11) + "…" : t);
  function heatmap(L, h, ql, kl) {
    const m = L.values[h], nq = m.length, nk = nq ? m[0].length : 0;
    const cell = Math.max(4, Math.min(18, Math.floor(240 / Math.max(nq, nk, 1))));
    const step = Math.ceil(11 / cell), font = "9.5px -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";
    let left = 4, top = 4;
    for (let i = 0; i < nq; i += step) left = Math.max(left, textWidth(short(ql[i]), font) + 6);
    for (let j = 0; j < nk; j += step) top = Math.max(top, textWidth(short(kl[j]), font) + 6);
    left = Math.ceil(left); top = Math.ceil(top);
    const out = [`<svg class="attn-map" xmlns="${NS}" width="${left + cell * nk + 2}" height="${top + cell * nq + 2}" data-head="${h}">`];
    for (let j = 0; j < nk; j += step) {
      const x = left + cell * j + cell / 2 + 3, y = top - 4;
      out.push(`<text class="klabel" data-k="${j}" x="${x}" y="${y}" transform="rotate(-90 ${x} ${y})">${esc(short(kl[j]))}</text>`);
    }
    for (let i = 0; i < nq; i += step) {
      out.push(`<text class="qlabel" data-q="${i}" x="${left - 4}" y="${top + cell * i + cell / 2 + 3}" text-anchor="end">${esc(short(ql[i]))}</text>`);
    }
    for (let i = 0; i < nq; i++) {
      for (let j = 0; j < nk; j++) {
        const raw = m[i][j], v = raw === null ? null : raw * A.scale;
        out.push(`<rect class="cell" x="${left + cell * j}" y="${top + cell * i}" width="${cell}" height="${cell}" fill="${attnColour(v)}" ` +
          `data-q="${i}" data-k="${j}" data-v="${v === null ? "nan" : v.toFixed(4)}"/>`);
      }
    }
    out.push("</svg>");
    return `<figure class="attn-head" data-head="${h}"><figcaption>head ${h}</figcaption>${out.join("")}</figure>`;
  }
  function showAttention(li) {
    if (!A || li < 0 || li >= A.layers.length) return;
    S.attn = li;
    const L = A.layers[li], nq = Math.min(L.queries, L.values.length ? L.values[0].length : 0);
    const ql = axis(L.queries), kl = axis(L.keys), ops = new Map(O.label.map((l, i) => [l, i]));
    const op = ops.has(L.op) ? `<a data-op="${ops.get(L.op)}">${esc(L.op)}</a>` : esc(L.op);
    el.attention.innerHTML = `<div class="attn-bar"><b>Attention</b> <select id="attn-layer">` +
      A.layers.map((l, i) => `<option value="${i}"${i === li ? " selected" : ""}>layer ${l.layer}</option>`).join("") +
      `</select> <span class="attn-what">${esc(L.name)} → ${op}${L.module ? " · " + esc(L.module) : ""} · ${L.heads} heads · ` +
      `${L.queries}×${L.keys} · batch row 0 · colour 0 → 1</span><button id="attn-close" title="close">×</button></div>` +
      (A.note ? `<div class="attn-note">${esc(A.note)}</div>` : "") +
      `<div class="attn-heads" data-layer="${L.layer}" data-queries="${nq}">` +
      L.values.map((_, h) => heatmap(L, h, ql, kl)).join("") + "</div>";
    el.attention.hidden = false;
    document.getElementById("attn-layer").onchange = (ev) => showAttention(+ev.target.value);
    document.getElementById("attn-close").onclick = hideAttention;
  }
  function hideAttention() { el.attention.hidden = true; el.tip.hidden = true; S.attn = null; }
  function attnTip(ev) {
    const r = ev.target.closest("rect.cell");
    if (!r) { el.tip.hidden = true; return; }
    const L = A.layers[S.attn], q = +r.getAttribute("data-q"), k = +r.getAttribute("data-k");
    const h = r.closest("svg").getAttribute("data-head");
    const named = (n, i) => (A.tokens && A.n_tokens === n ? ` "${axis(n)[i]}"` : ""); // a token, quoted
    el.tip.textContent = `head ${h} · query ${q}${named(L.queries, q)} → key ${k}${named(L.keys, k)}: ${r.getAttribute("data-v")}`;
    const box = el.attention.parentNode.getBoundingClientRect();
    el.tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 260) + "px";
    el.tip.style.top = (ev.clientY - box.top + 14) + "px";
    el.tip.hidden = false;
  }

  // ---- view ----------------------------------------------------------------------------------
  function apply() { el.scene.setAttribute("transform", `translate(${S.view.x},${S.view.y}) scale(${S.view.k})`); }
  function fit() {
    const r = el.svg.getBoundingClientRect();
    const kw = (r.width - 20) / Math.max(tree.w, 1), kh = (r.height - 20) / Math.max(tree.h, 1);
    let k = Math.min(1.2, kw, kh);
    if (k < 0.6) k = Math.min(0.6, kw); // a tall graph: readable from the top, scroll for more
    S.view = { k, x: (r.width - tree.w * k) / 2, y: Math.max(10, (r.height - tree.h * k) / 2) };
    apply();
  }
  function focus(u) {
    const r = el.svg.getBoundingClientRect();
    const k = Math.max(S.view.k, 0.8);
    S.view = { k, x: r.width / 2 - (u.x + u.w / 2) * k, y: r.height / 2 - (u.y + u.h / 2) * k };
    apply();
  }

  // ---- page ----------------------------------------------------------------------------------
  const el = {};
  function setup() {
    const root = document.documentElement.style;
    const vars = { "--bg": T.background, "--font": T.font, "--muted": T.muted_font, "--border": T.cluster_border,
      "--panel": T.cluster_fills[0], "--node-border": T.node_border, "--cluster-border": T.cluster_border,
      "--edge": T.edge, "--edge-font": T.edge_font, "--accent": T.name === "dark" ? "#58a6ff" : "#0969da",
      "--hit": "#d1242f", "--banner": T.fold_fill };
    for (const k in vars) root.setProperty(k, vars[k]);
    const app = document.getElementById("app");
    app.innerHTML = `<div class="bar"><h1>${esc(D.title)}</h1>` +
      `<input id="search" type="search" placeholder="Search label, function, module, class…"><span id="hits" class="count"></span>` +
      `<label>depth <input id="depth" type="number" min="0" value="${shownDepth()}"></label><button id="expand-depth">Expand to depth</button>` +
      `<button id="collapse-all">Collapse all</button><button id="expand-all">Expand all</button>` +
      (hasRolls ? `<label><input id="rolled" type="checkbox"${S.rolled ? " checked" : ""}> roll loops</label>` : "") +
      `<label>colour <select id="color"><option value="">kind</option><option value="time_ns">time</option>` +
      `<option value="flops">FLOPs</option><option value="params">parameters</option><option value="bytes">output bytes</option>` +
      (D.metric ? `<option value="metric" selected>${esc(D.metric)}</option>` : "") + `</select></label>` +
      `<label><input id="labels" type="checkbox" checked> shapes on edges</label><button id="fit">Fit</button>` +
      (A ? `<button id="attention-btn" title="the saved attention patterns, one heatmap per head">Attention</button>` : "") +
      (STEPS ? `<label>step <select id="step">${STEPS.rows.map((r, i) => `<option value="${i}"${i === S.step ? " selected" : ""}>` +
        `${r.step}${i === 0 && STEPS.rows.length > 1 && STEPS.rows[1].graph !== r.graph ? " (prefill)" : ""}` +
        `${r.token !== null && r.token !== undefined ? " · token " + r.token : ""} · ${r.time_ms} ms</option>`).join("")}</select></label>` : "") +
      `<span id="count" class="count"></span></div><div class="banner" id="banner"></div>` +
      `<div class="main"><svg class="graph" id="graph" xmlns="${NS}"><defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
      `<path d="M0,0L10,5L0,10z" fill="${T.edge}"/></marker></defs><g id="scene"></g></svg>` +
      `<div class="details" id="details"></div><div class="legend" id="legend"></div>` +
      (A ? `<div class="attention" id="attention" hidden></div><div class="attn-tip" id="attn-tip" hidden></div>` : "") + `</div>`;
    for (const id of ["graph", "scene", "details", "legend", "count", "hits", "banner", "search", "depth", "attention"]) el[id] = document.getElementById(id);
    el.tip = document.getElementById("attn-tip");
    if (A) {
      document.getElementById("attention-btn").onclick = () => {
        if (!el.attention.hidden) hideAttention(); else showAttention(S.attn ?? 0);
      };
      el.attention.addEventListener("mouseover", attnTip);
      el.attention.addEventListener("mouseleave", () => { el.tip.hidden = true; });
      el.attention.addEventListener("click", (ev) => { if (jump(ev)) hideAttention(); });
    }
    el.svg = el.graph;
    if (D.banner) el.banner.textContent = "⚠ " + D.banner + " — this graph is the forward for that synthesized input.";
    if (D.diff) el.banner.textContent = (D.banner ? el.banner.textContent + " " : "") + `Diff of ${D.diff.a} → ${D.diff.b} (atol ${D.diff.atol}, rtol ${D.diff.rtol}): ` +
      (D.diff.first ? `first divergence ${D.diff.first_where}` : "no op differs beyond the tolerance");
    el.search.addEventListener("keydown", (ev) => {
      if (ev.key !== "Enter") return;
      const q = ev.target.value.trim().toLowerCase();
      if (q === S.query && S.hits.length) next(); else { S.query = q; search(q); }
    });
    document.getElementById("expand-depth").onclick = () => {
      const n = +el.depth.value || 0;
      S.expanded = new Set(C.map((c, i) => i).filter((i) => C[i].depth < n));
      render(); fit();
    };
    document.getElementById("collapse-all").onclick = () => { S.expanded.clear(); S.unfolded.clear(); render(); fit(); };
    document.getElementById("expand-all").onclick = () => {
      S.expanded = new Set(C.map((c, i) => i)); G.forEach((g, i) => S.unfolded.add(i)); S.rolled = false;
      const box = document.getElementById("rolled"); if (box) box.checked = false;
      render(); fit();
    };
    const rolled = document.getElementById("rolled");
    if (rolled) rolled.onchange = () => { S.rolled = rolled.checked; render(); };
    document.getElementById("color").onchange = (ev) => { S.colorBy = ev.target.value; render(); };
    document.getElementById("labels").onchange = (ev) => { S.labels = ev.target.checked; render(); };
    document.getElementById("fit").onclick = fit;
    if (STEPS) document.getElementById("step").onchange = (ev) => {
      const pos = +ev.target.value;
      if (STEPS.rows[pos].graph === STEPS.rows[S.step].graph) {
        applyStep(pos); render(); if (S.selected) details(S.selected);
        history.replaceState(null, "", "#step=" + pos);
      }
      else { location.hash = "step=" + pos; location.reload(); }
    };
    el.scene.addEventListener("click", (ev) => {
      const target = ev.target.closest("[data-id]");
      if (!target) return;
      const id = target.getAttribute("data-id");
      if (id[0] === "k") { S.expanded.delete(+id.slice(1)); render(); return; }
      if (id[0] === "c") {
        const c = +id.slice(1), li = attnLayerOf(id);
        if (foldedGroup(c)) open(C[c].group); else S.expanded.add(c);
        render();
        if (li >= 0) showAttention(li);
        return;
      }
      select(id, true);
    });
    el.scene.addEventListener("mouseover", (ev) => {
      const target = ev.target.closest("g[data-id]");
      if (target && !S.pinned) details(target.getAttribute("data-id"));
    });
    const jump = (ev) => {
      const a = ev.target.closest("[data-op]");
      if (!a) return false;
      const i = +a.getAttribute("data-op");
      reveal(i); render();
      const u = units.get(unitOf(i));
      if (u) { focus(u); select(u.id, true); }
      return true;
    };
    el.legend.addEventListener("click", jump);
    el.details.addEventListener("click", (ev) => {
      const a = ev.target.closest("[data-op]"), b = ev.target.closest("[data-act]");
      if (a) {
        const i = +a.getAttribute("data-op");
        reveal(i); render();
        const u = units.get(unitOf(i));
        if (u) { focus(u); select(u.id, true); }
      } else if (b && b.getAttribute("data-act") === "attention") {
        showAttention(+b.getAttribute("data-layer"));
      } else if (b) {
        const act = b.getAttribute("data-act"), c = +b.getAttribute("data-call"), g = +b.getAttribute("data-group");
        if (act === "unfold") open(C[c].group);
        if (act === "fold") S.unfolded.delete(g);
        if (act === "expand") S.expanded.add(c);
        if (act === "collapse") S.expanded.delete(c);
        render();
        el.details.innerHTML = "";
      }
    });
    let drag = null;
    el.svg.addEventListener("mousedown", (ev) => {
      if (ev.target.closest("[data-id]")) return;
      drag = { x: ev.clientX - S.view.x, y: ev.clientY - S.view.y };
      el.svg.classList.add("dragging");
    });
    window.addEventListener("mousemove", (ev) => { if (drag) { S.view.x = ev.clientX - drag.x; S.view.y = ev.clientY - drag.y; apply(); } });
    window.addEventListener("mouseup", () => { drag = null; el.svg.classList.remove("dragging"); });
    el.svg.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = el.svg.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      const k = Math.min(8, Math.max(0.02, S.view.k * Math.exp(-ev.deltaY * 0.0015)));
      S.view.x = px - (px - S.view.x) * (k / S.view.k);
      S.view.y = py - (py - S.view.y) * (k / S.view.k);
      S.view.k = k;
      apply();
    }, { passive: false });
    el.svg.addEventListener("click", (ev) => { if (!ev.target.closest("[data-id]")) { S.pinned = false; el.details.innerHTML = ""; } });
  }

  if (STEPS) applyStep(stepPos);
  window.torchlens = {
    data: D, state: S,
    render: () => render(),
    nodeCount: () => [...units.values()].filter((u) => u.kind === "node").length,
    expandAll: () => document.getElementById("expand-all").click(),
    attention: (li) => showAttention(li),
  };
  function openAtDivergence() { // a diff page opens on the op that introduced the difference
    const i = D.diff ? D.diff.first_op : null;
    if (i === null || i === undefined) return;
    const u = units.get(unitOf(i));
    if (!u) return;
    const r = el.svg.getBoundingClientRect(), k = S.view.k;
    const x = S.view.x + u.x * k, y = S.view.y + u.y * k;
    if (x < 0 || y < 0 || x + u.w * k > r.width || y + u.h * k > r.height) focus(u);
    select(u.id, false);
  }

  setup();
  render();
  fit();
  openAtDivergence();
  window.torchlens.ready_ms = performance.now();
  document.body.setAttribute("data-ready", "1");
})();
