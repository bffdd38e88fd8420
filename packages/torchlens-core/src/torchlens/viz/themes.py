"""Colour themes for drawings: plain palettes any renderer can read (no renderer imports here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Theme:
    """One palette. Colours are ``#rrggbb`` strings; ``cluster_fills`` cycles by nesting depth."""

    name: str
    background: str
    font: str
    muted_font: str
    node_fill: str
    node_border: str
    module_fill: str
    fold_fill: str
    input_fill: str
    output_fill: str
    edge: str
    edge_font: str
    cluster_fills: tuple[str, ...]
    cluster_border: str
    fontname: str = "Helvetica"
    filled: bool = True

    def cluster_fill(self, depth: int) -> str:
        """Fill of a cluster at nesting ``depth`` (1 = outermost)."""
        return self.cluster_fills[(max(depth, 1) - 1) % len(self.cluster_fills)]


THEMES: dict[str, Theme] = {
    "light": Theme(
        name="light", background="#ffffff", font="#1f2328", muted_font="#57606a",
        node_fill="#f6f8fa", node_border="#8c959f", module_fill="#ddf4ff", fold_fill="#fff8c5",
        input_fill="#dafbe1", output_fill="#ffebe9", edge="#6e7781", edge_font="#57606a",
        cluster_fills=("#f3f6fb", "#e9eef7", "#f7f3fb", "#eef7f1"), cluster_border="#afb8c1",
    ),
    "dark": Theme(
        name="dark", background="#0d1117", font="#e6edf3", muted_font="#9da7b3",
        node_fill="#21262d", node_border="#6e7681", module_fill="#0c2d6b", fold_fill="#4b3a05",
        input_fill="#0f3d1e", output_fill="#5a1e1e", edge="#8b949e", edge_font="#9da7b3",
        cluster_fills=("#161b22", "#1c2330", "#221b2e", "#17251d"), cluster_border="#30363d",
    ),
    "print": Theme(
        name="print", background="#ffffff", font="#000000", muted_font="#333333",
        node_fill="#ffffff", node_border="#000000", module_fill="#ffffff", fold_fill="#ffffff",
        input_fill="#ffffff", output_fill="#ffffff", edge="#000000", edge_font="#000000",
        cluster_fills=("#ffffff",), cluster_border="#555555", fontname="Times", filled=False,
    ),
}
