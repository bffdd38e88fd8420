"""The error catalogue (the documentation's error page) lists every code with the teaches its
raise sites give, read from the source."""

from __future__ import annotations

import torchlens as tl
from torchlens.catalogue import catalogue, markdown
from torchlens.errors import CODES


def test_every_code_is_listed_once_with_what_its_raise_sites_teach():
    rows = catalogue()
    assert [r["code"] for r in rows] == list(CODES)
    by_code = {r["code"]: r for r in rows}
    # a keyword teach, and an f-string teach shown with its value left out
    assert "tl.trace(model, x)  # a real input" in by_code["input_recipe_ambiguous"]["teach"]
    assert any("…" in t for t in by_code["steps_not_reached"]["teach"])
    assert "torchlens.steps.capture" in by_code["steps_nested"]["raised_in"]
    # a class's own code and a helper taking the code first are found too
    assert by_code["trace_file_invalid"]["raised_in"]
    assert "torchlens.edits.values" in by_code["edit_dtype_mismatch"]["raised_in"]


def test_the_markdown_table_has_a_row_per_code():
    table = markdown().splitlines()
    assert len(table) == 2 + len(CODES)
    assert table[2].startswith("| `input_rung_conflict` |")
    assert tl.catalogue.catalogue is catalogue
