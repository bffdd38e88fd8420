"""Drawing at scale: ``Trace.draw`` time (svg and html) against op count, the html page's size,
and how fast the page is in headless Chromium (``python benchmarks/draw_scale.py``).

Two families of graphs, each from about 100 to 10,000 ops, CPU, metadata-only traces:

- ``gpt2``: a narrow ``GPT2LMHeadModel`` (32 wide, 2 heads) with as many layers as the op count
  asks: module structure, folds of identical blocks;
- ``loop``: a recurrent loop written at the root (5 ops a step, no submodule at all), the shape
  that used to keep ``dot`` busy for minutes.

For each: the median of ``--runs`` calls of ``trace.draw(collapse="auto", file_format=...)`` for
svg (dot) and html, the html file's bytes and bytes per op, and what ``collapse="none"`` as svg
does (drawn, or refused ``drawing_too_large`` before dot, and how fast). Then in headless
Chromium (network off): the first view of GPT-2 with 12 layers, collapse="auto" (ms from
navigation start until the first view is drawn), and "Expand all" on the ~5,000-op graphs (ms to
lay out and paint everything). Targets: first view <= 1 s; 5,000 ops expanded <= 5 s; file size
<= 2 MB + 300 bytes/op. Prints PASS/MISS; writes results/draw_scale.{json,md}.

    python benchmarks/draw_scale.py             # 100 .. 10,000 ops
    python benchmarks/draw_scale.py --quick     # 100 .. 1,000 ops, 1 run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root, for tests.viz.browser

import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from tests.models.zoo import RootLoop  # noqa: E402

OPS = (100, 1_000, 2_500, 5_000, 10_000)
GPT2_OPS_PER_LAYER, GPT2_BASE_OPS = 39, 25  # measured: ops of an n-layer narrow GPT-2 ≈ 39n+25


def gpt2(layers: int) -> tuple[nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                        use_cache=False, bos_token_id=99, eos_token_id=99)
    return GPT2LMHeadModel(config).eval(), {"input_ids": torch.randint(0, 100, (1, 8))}


def loop(steps: int) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    return RootLoop(steps).eval(), torch.randn(2, steps, 4)


def build(family: str, ops: int) -> tl.Trace:
    if family == "gpt2":
        model, x = gpt2(max(1, round((ops - GPT2_BASE_OPS) / GPT2_OPS_PER_LAYER)))
    else:
        model, x = loop(max(1, round((ops - 4) / 5)))
    return tl.trace(model, x, save="none")


def timed(fn, runs: int) -> tuple[float, Any]:
    samples, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def draw_row(family: str, target: int, runs: int, folder: Path) -> dict[str, Any]:
    trace = build(family, target)
    n = len(trace.ops)
    svg_s, svg = timed(lambda: trace.draw(collapse="auto", path=folder / "g.svg"), runs)
    html_path = folder / f"{family}-{n}.html"
    html_s, page = timed(lambda: trace.draw(collapse="auto", path=html_path), runs)
    start = time.perf_counter()
    try:
        trace.draw(collapse="none", path=folder / "none.svg")
        none = "drawn"
    except tl.TorchLensError as e:
        none = e.code
    none_s = time.perf_counter() - start
    size = len(page.data)
    return {"family": family, "ops": n, "svg_auto_s": svg_s, "svg_nodes": svg.stats["nodes"],
            "html_auto_s": html_s, "html_bytes": size, "html_bytes_per_op": size / n,
            "size_ok": size <= 2_000_000 + 300 * n, "svg_none": none, "svg_none_s": none_s,
            "page": str(html_path)}


def browser_rows(rows: list[dict[str, Any]], folder: Path, runs: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    from tests.viz.browser import CHROMIUM_ARGS, Viewer, chromium_path

    model, x = gpt2(12)
    first = tl.trace(model, x, save="none").draw(collapse="auto", path=folder / "gpt2-12.html")
    out: dict[str, Any] = {"first_view_ms": [], "expand_all": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        for _ in range(runs):
            viewer = Viewer(browser, first.path)
            out["first_view_ms"].append(viewer.page.evaluate("window.torchlens.ready_ms"))
            assert not viewer.errors and not viewer.blocked, viewer.errors + viewer.blocked
            viewer.close()
        for row in rows:
            if not 4_000 <= row["ops"] <= 6_000:
                continue
            viewer = Viewer(browser, Path(row["page"]))
            start = time.perf_counter()
            viewer.page.click("#expand-all")
            wall = (time.perf_counter() - start) * 1000
            out["expand_all"].append({
                "family": row["family"], "ops": row["ops"], "nodes": viewer.nodes(),
                "render_ms": viewer.page.evaluate("window.torchlens.last_render_ms"),
                "click_to_painted_ms": wall, "errors": viewer.errors})
            viewer.close()
        browser.close()
    out["first_view_ms_median"] = statistics.median(out["first_view_ms"])
    return out


def report(rows: list[dict[str, Any]], page: dict[str, Any]) -> str:
    lines = ["| graph | ops | svg auto (s) | svg nodes | html auto (s) | html bytes | bytes/op "
             "| size target | collapse=none as svg |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['ops']:,} | {r['svg_auto_s']:.2f} | {r['svg_nodes']} | "
            f"{r['html_auto_s']:.2f} | {r['html_bytes']:,} | {r['html_bytes_per_op']:.0f} | "
            f"{'PASS' if r['size_ok'] else 'MISS'} | {r['svg_none']} in {r['svg_none_s']:.2f} s |")
    if page:
        ms = page["first_view_ms_median"]
        lines += ["", f"- first view, GPT-2 12 layers, collapse=\"auto\", headless Chromium: "
                      f"{ms:.0f} ms (median of {len(page['first_view_ms'])}) — "
                      f"{'PASS' if ms <= 1000 else 'MISS'} (<= 1 s)"]
        for e in page["expand_all"]:
            ok = e["click_to_painted_ms"] <= 5000
            lines.append(f"- \"Expand all\" on {e['family']} ({e['ops']:,} ops → {e['nodes']:,} "
                         f"boxes): {e['click_to_painted_ms']:.0f} ms click to painted (layout + "
                         f"paint {e['render_ms']:.0f} ms) — {'PASS' if ok else 'MISS'} (<= 5 s)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 .. 1,000 ops, one run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "draw_scale.json")
    args = parser.parse_args(argv)
    sizes = OPS[:2] if args.quick else OPS
    runs = 1 if args.quick else args.runs
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = []
        for family in ("gpt2", "loop"):
            for target in sizes:
                rows.append(draw_row(family, target, runs, folder))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "page"}), flush=True)
        page = {} if args.no_browser else browser_rows(rows, folder, runs)
    text = report(rows, page)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row.pop("page")
    args.json.write_text(json.dumps({"rows": rows, "browser": page}, indent=1) + "\n")
    args.json.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
