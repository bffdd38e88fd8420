"""The plugin host (pluggy) and the error/warning contract."""

from __future__ import annotations

import warnings

import pluggy
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens import hookspecs
from torchlens.errors import CODES, TorchLensError, TorchLensWarning, warn
from torchlens.plugins import get_plugin_manager, list_plugins
from torchlens.types import ResolvedInput


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


class Point:
    def __init__(self, v):
        self.v = v


class PointPlugin:
    """Resolves a Point into a tensor: proves resolve_input hooks are called."""

    calls = 0

    @tl.hookimpl
    def torchlens_resolve_input(self, model, value):
        if not isinstance(value, Point):
            return None
        PointPlugin.calls += 1
        return ResolvedInput((torch.tensor([value.v]),), {}, facts={"plugin": "point"})


def test_runtime_plugin_hooks_are_called():
    pm = get_plugin_manager()
    plugin = PointPlugin()
    pm.register(plugin)
    try:
        trace = tl.trace(Doubler(), Point(3.0))
        assert PointPlugin.calls == 1
        assert trace.provenance["resolver"] == {"plugin": "point"}
        assert torch.equal(trace.output, torch.tensor([6.0]))
    finally:
        pm.unregister(plugin)
    assert pm.get_plugin(str(id(plugin))) is None


def test_every_hook_spec_documented_and_prefixed():
    names = [n for n in dir(hookspecs) if n.startswith("torchlens_")]
    assert {"torchlens_resolve_input", "torchlens_input_recipe", "torchlens_shape_candidates",
            "torchlens_refusal_teach", "torchlens_renderers",
            "torchlens_decode_output"} <= set(names)
    for name in names:
        assert getattr(hookspecs, name).__doc__


def test_list_plugins_reports_names_and_versions():
    rows = list_plugins()
    for row in rows:
        assert set(row) == {"name", "module", "distribution", "version"}
        if row["distribution"]:
            assert row["version"]


def test_misspelled_hookimpl_is_caught():
    class Typo:
        @tl.hookimpl
        def torchlens_resolve_inptu(self, model):
            return None

    pm = get_plugin_manager()
    plugin = Typo()
    pm.register(plugin)
    try:
        with pytest.raises(pluggy.PluginValidationError):
            pm.check_pending()
    finally:
        pm.unregister(plugin)


def test_error_contract():
    err = TorchLensError("bad", code="input_shape_invalid", teach=["a()", "b()"])
    assert err.code == "input_shape_invalid" and err.teach == ["a()", "b()"]
    assert "1. a()" in str(err) and str(err).startswith("[input_shape_invalid]")
    for code in ("input_rung_conflict", "nongold_semantics_unavailable", "nongold_raw_value_read",
                 "state_baseline_unavailable", "lazy_uninitialized",
                 "batchnorm_train_stats_mutated", "parameter_created_in_forward",
                 "trace_file_invalid", "input_shape_invalid", "nested_trace"):
        assert code in CODES


def test_warning_contract_filterable_by_code():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("nongold_raw_value_read", "x")
    assert caught[0].category is TorchLensWarning and caught[0].message.code == \
        "nongold_raw_value_read"
    assert str(caught[0].message).startswith("nongold_raw_value_read")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="nongold_raw_value_read")
        warn("nongold_raw_value_read", "x")
    assert not caught


def test_decode_output_hook_answers_for_gold_traces():
    """torchlens_decode_output: a plugin's semantics win over the core's labels fallback."""
    from torchlens.types import DecodedOutput

    class Decoder:
        @tl.hookimpl
        def torchlens_decode_output(self, trace, k):
            return DecodedOutput(f"top of {trace.meta['model_class']}", [{"rank": 1}] * k, "me")

    pm = get_plugin_manager()
    plugin = Decoder()
    pm.register(plugin)
    try:
        trace = tl.trace(Doubler(), torch.rand(3))
        assert str(trace.decode_output()) == "top of Doubler"
        assert trace.output_table(k=2) == [{"rank": 1}, {"rank": 1}]
        declared = tl.trace(Doubler(), input_shape=(3,))
        with pytest.raises(tl.TorchLensError) as err:
            declared.decode_output()
        assert err.value.code == "nongold_semantics_unavailable"
    finally:
        pm.unregister(plugin)
