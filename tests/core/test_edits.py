"""Edits (tl.edits) on small models: each kind against a hand-written hook doing the same thing,
the proof of firing, the refusals, and that the model, its state and the RNG are left alone."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture.policy import state_hash


class Block(nn.Module):
    """A residual block: the residual ``add`` is an op no module boundary exposes."""

    def __init__(self, d: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.mlp(x))


class Net(nn.Module):
    def __init__(self, d: int = 8, n: int = 3):
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class Shared(nn.Module):
    """One module called three times: its ops have passes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        for _ in range(3):
            x = torch.relu(self.fc(x))
        return x


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        h = self.fc(x)
        h.mul_(2)  # in place: later readers read h itself
        return h.sum(-1) + h[:, 0]


class TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]) + h[0].sum(-1, keepdim=True)


def _net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 5, 4)


def _hooked(model, module, fn, x):
    """The plain-PyTorch way: a forward hook that returns the edited output."""
    handle = module.register_forward_hook(lambda m, a, out: fn(out, a))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def _add_label(model, x, block):
    """The label of the residual ``add`` inside ``blocks.{block}``."""
    trace = tl.trace(model, x, save=None)
    return next(op.label for op in trace if op.func == "add" and
                op.module == f"blocks.{block}")


# ---- each kind against a hook ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["zero", "scale", "add", "replace", "mean", "callable"])
def test_module_edit_equals_a_forward_hook(kind):
    model, x = _net()
    steer = torch.randn(8)
    rows = torch.randn(10, 5, 8)
    edits = {"zero": (tl.edits.zero(), lambda o, a: torch.zeros_like(o)),
             "scale": (tl.edits.scale(0.25), lambda o, a: o * 0.25),
             "add": (tl.edits.add(steer, alpha=3.0), lambda o, a: o + 3.0 * steer),
             "replace": (tl.edits.replace(rows[0]), lambda o, a: rows[0].expand_as(o)),
             "mean": (tl.edits.mean(rows), lambda o, a: rows.mean(0).expand_as(o)),
             "callable": (lambda v, op: v.flip(-1), lambda o, a: o.flip(-1))}
    edit, hook = edits[kind]
    expected = _hooked(model, model.blocks[1].mlp, hook, x)
    with torch.no_grad():
        plain = model(x)
    trace = tl.trace(model, x, edits={"blocks.1.mlp": edit})
    assert torch.allclose(trace.output, expected, atol=1e-6)
    assert not torch.allclose(trace.output, plain)
    [row] = trace.edits
    assert row["site"] == "blocks.1.mlp" and row["kind"] == (
        kind if kind != "callable" else "callable") and row["fired"] and row["norm"] > 0
    assert row["module"] == "blocks.1.mlp" and row["shape"] == [2, 5, 8]
    assert row["label"] == trace["blocks.1.mlp"].calls[0].output_ops[0]


def test_op_edit_on_the_residual_add_equals_a_hand_written_forward():
    model, x = _net()
    label = _add_label(model, x, 2)
    trace = tl.trace(model, x, edits={label: tl.edits.zero(index=(slice(None), 3))})
    with torch.no_grad():
        h = model.inp(x)
        for i, block in enumerate(model.blocks):
            r = h + block.mlp(h)
            if i == 2:
                r = r.clone()
                r[:, 3] = 0
            h = block.norm(r)
        expected = model.head(h)
    assert torch.allclose(trace.output, expected, atol=1e-6)
    [row] = trace.edits
    assert row["label"] == label and row["index"] == "[:, 3]" and row["module"] == "blocks.2"
    # downstream saved values follow the edit; the edited op's saved value is the edited one
    assert torch.equal(trace[label].out[:, 3], torch.zeros(2, 8))
    assert not torch.equal(trace[label].out[:, 2], torch.zeros(2, 8))


def test_index_leaves_everything_outside_it_unchanged():
    model, x = _net()
    clean = tl.trace(model, x, save=["blocks.0.mlp"])
    edited = tl.trace(model, x, save=["blocks.0.mlp"],
                      edits={"blocks.0.mlp": tl.edits.scale(5.0, index=(slice(None), 1))})
    before, after = clean["blocks.0.mlp"].out, edited["blocks.0.mlp"].out
    assert torch.allclose(after[:, 1], before[:, 1] * 5)
    keep = torch.ones(5, dtype=torch.bool)
    keep[1] = False
    assert torch.equal(after[:, keep], before[:, keep])


def test_patch_from_a_clean_trace_equals_hooking_in_the_clean_value():
    model, x = _net()
    corrupt = x + 0.5 * torch.randn_like(x)
    clean = tl.trace(model, x, save=["blocks.1"])
    value = clean["blocks.1"].out
    expected = _hooked(model, model.blocks[1], lambda o, a: value, corrupt)
    patched = tl.trace(model, corrupt, edits={"blocks.1": tl.edits.patch(clean)})
    assert torch.allclose(patched.output, expected, atol=1e-6)
    # patching the whole stream at the last block gives the clean output
    last = tl.trace(model, x, save=["blocks.2"])
    full = tl.trace(model, corrupt, edits={"blocks.2": tl.edits.patch(last)})
    assert torch.allclose(full.output, last.output, atol=1e-6)


def test_patch_of_one_position_of_an_op():
    model, x = _net()
    corrupt = torch.randn_like(x)
    label = _add_label(model, x, 0)
    clean = tl.trace(model, x, save=[label])
    patched = tl.trace(model, corrupt, save=[label], edits={
        label: tl.edits.patch(clean, index=(slice(None), 2))})
    assert torch.equal(patched[label].out[:, 2], clean[label].out[:, 2])
    other = tl.trace(model, corrupt, save=[label])
    assert torch.equal(patched[label].out[:, 0], other[label].out[:, 0])


def test_skip_equals_the_block_replaced_by_identity():
    model, x = _net()
    trace = tl.trace(model, x, edits={"blocks.1": tl.edits.skip()})
    original = model.blocks[1]
    model.blocks[1] = nn.Identity()
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        model.blocks[1] = original
    assert torch.allclose(trace.output, expected, atol=1e-6)


def test_skip_with_other_shapes_refuses():
    model, x = _net()
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"inp": tl.edits.skip()})
    assert err.value.code == "edit_shape_mismatch"
    assert "2×5×4" in err.value.message and "2×5×8" in err.value.message


def test_a_glob_edits_every_matching_module_and_every_pass():
    model, x = _net()
    trace = tl.trace(model, x, edits={"blocks.*.mlp": tl.edits.zero()})
    assert [row["module"] for row in trace.edits] == ["blocks.0.mlp", "blocks.1.mlp",
                                                      "blocks.2.mlp"]
    with torch.no_grad():
        h = model.inp(x)
        for block in model.blocks:
            h = block.norm(h)
        expected = model.head(h)
    assert torch.allclose(trace.output, expected, atol=1e-6)


def test_pass_qualified_labels_edit_one_pass_and_bare_labels_every_pass():
    torch.manual_seed(1)
    model, x = Shared(), torch.randn(2, 6)
    one = tl.trace(model, x, edits={"linear_1:2": tl.edits.zero()})
    assert [(row["label"], row["pass"]) for row in one.edits] == [("linear_1:2", 2)]
    with torch.no_grad():
        expected = torch.relu(model.fc(torch.zeros(2, 6)))
    assert torch.allclose(one.output, expected)
    every = tl.trace(model, x, edits={"linear_1": tl.edits.scale(1.5)})
    assert [row["label"] for row in every.edits] == ["linear_1", "linear_1:2", "linear_1:3"]
    with torch.no_grad():
        h = x
        for _ in range(3):
            h = torch.relu(model.fc(h) * 1.5)
    assert torch.allclose(every.output, h)
    call = tl.trace(model, x, edits={"fc:3": tl.edits.zero()})
    assert [row["pass"] for row in call.edits] == [3]
    assert torch.equal(call.output, torch.zeros(2, 6))


def test_an_in_place_op_is_edited_where_later_readers_read():
    torch.manual_seed(2)
    model, x = InPlace(), torch.randn(3, 5)
    trace = tl.trace(model, x, edits={"mul__1": tl.edits.zero(index=(slice(None), 0))})
    with torch.no_grad():
        h = model.fc(x) * 2
        h[:, 0] = 0
        expected = h.sum(-1) + h[:, 0]
    assert torch.allclose(trace.output, expected, atol=1e-6)


def test_item_picks_a_tensor_of_a_tuple_output():
    torch.manual_seed(3)
    model, x = TupleOut().eval(), torch.randn(2, 4, 4)
    trace = tl.trace(model, x, edits={"lstm": tl.edits.zero()})  # the first tensor: out
    expected = _hooked(model, model.lstm, lambda o, a: (torch.zeros_like(o[0]), o[1]), x)
    assert torch.allclose(trace.output, expected, atol=1e-6)
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"lstm": tl.edits.zero(item=5)})
    assert err.value.code == "edit_invalid"


# ---- proof of firing -------------------------------------------------------------------------
def test_zeroing_zeros_is_reported_as_exactly_zero_change():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU()).eval()
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
    trace = tl.trace(model, torch.randn(2, 3), edits={"1": tl.edits.zero()})
    [row] = trace.edits
    assert row["fired"] and row["norm"] == 0.0 and row["zero_change"]
    assert "exactly zero" in str(trace.edits)


def test_a_label_the_forward_never_produces_refuses_after_it_with_the_partial_trace():
    model, x = _net()
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"relu_1": tl.edits.zero()})  # the model uses gelu
    assert err.value.code == "edit_site_not_fired"
    assert err.value.partial_trace is not None and len(err.value.partial_trace) > 10
    assert any("allow_unfired=True" in t for t in err.value.teach)
    trace = tl.trace(model, x, edits={"relu_1": tl.edits.zero(), "gelu_1": tl.edits.zero()},
                     allow_unfired=True)
    assert trace.edits.unfired == ["relu_1"]
    assert "NOT FIRED" in str(trace.edits)


def test_a_site_that_names_nothing_refuses_before_any_forward(count_forwards):
    model, x = _net()
    calls = count_forwards(model)
    for site in ["blocks.9.mlp", "blocks.*.attn", "not a label", "blocks.0.mpl"]:
        with pytest.raises(tl.TorchLensError) as err:
            tl.trace(model, x, edits={site: tl.edits.zero()})
        assert err.value.code == "edit_site_unknown"
    assert calls.n == 0
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.0.mpl": tl.edits.zero()})
    assert any("blocks.0.mlp" in t for t in err.value.teach)


def test_bad_edits_refuse_typed_before_any_forward(count_forwards):
    model, x = _net()
    calls = count_forwards(model)
    for edits in [{"blocks.0": 3}, [("blocks.0", 1)], {0: tl.edits.zero()}]:
        with pytest.raises(tl.TorchLensError) as err:
            tl.trace(model, x, edits=edits)
        assert err.value.code == "edit_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        tl.edits.zero(index="x")
    assert err.value.code == "edit_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        tl.edits.scale("2")
    assert err.value.code == "edit_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        tl.edits.add([1.0, 2.0])
    assert err.value.code == "edit_invalid"
    assert calls.n == 0


def test_a_patch_source_without_the_site_or_of_another_model_refuses_before_the_forward(
        count_forwards):
    model, x = _net()
    clean = tl.trace(model, x, save=["blocks.0"])
    calls = count_forwards(model)
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.1": tl.edits.patch(clean)})
    assert err.value.code == "edit_source_missing"
    assert "save=['blocks.1']" in err.value.teach[0]
    other = nn.Sequential(nn.Linear(4, 8))
    foreign = tl.trace(other, torch.randn(2, 4))
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.0": tl.edits.patch(foreign)})
    assert err.value.code == "edit_source_model_mismatch"
    assert calls.n == 0


def test_a_shape_or_dtype_that_does_not_fit_refuses_naming_both():
    model, x = _net()
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.replace(torch.ones(3, 8))})
    assert err.value.code == "edit_shape_mismatch"
    assert "blocks.0.mlp" in err.value.message and "3×8" in err.value.message
    assert err.value.partial_trace is not None
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.add(torch.ones(8, dtype=torch.cfloat))})
    assert err.value.code == "edit_dtype_mismatch"
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"blocks.0.mlp": lambda v, op: v.sum().item()})
    assert err.value.code == "edit_invalid" and "float" in err.value.message


def test_model_state_and_rng_are_unchanged_after_edits_and_refusals():
    model, x = _net()
    model.train()
    before = state_hash(model)
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    tl.trace(model, x, edits={"blocks.*.mlp": tl.edits.zero(), _add_label(model, x, 1):
                              tl.edits.scale(2.0)})
    with pytest.raises(tl.TorchLensError):
        tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.replace(torch.ones(3))})
    assert state_hash(model) == before
    assert [m.training for m in model.modules()] == modes
    assert all(not m._forward_hooks and "_compiled_call_impl" not in m.__dict__
               for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)  # no forward here draws random numbers
    summary = tl.summary(model, x, edits={"blocks.0.mlp": tl.edits.zero()})
    assert summary.receipt.verified and torch.equal(torch.get_rng_state(), rng)
    # with dropout in train mode, an edited capture draws exactly what a plain forward draws
    dropping = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    torch.manual_seed(5)
    model(x)
    dropping(x[0])
    after_plain = torch.get_rng_state()
    torch.manual_seed(5)
    model(x)
    tl.trace(dropping, x[0], edits={"0": tl.edits.scale(2.0)})
    assert torch.equal(torch.get_rng_state(), after_plain)


# ---- marked as edited everywhere ---------------------------------------------------------------
def test_an_edited_trace_says_so_and_keeps_saying_so_after_save_and_load(tmp_path):
    model, x = _net()
    steer = torch.randn(8)
    trace = tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.add(steer, alpha=2.0)})
    assert trace.edited and "EDITED" in repr(trace) and "EDITED" in str(trace)
    [spec] = trace.provenance["edits"]
    assert spec["kind"] == "add" and spec["alpha"] == 2.0 and spec["shape"] == [8]
    assert len(spec["sha256"]) == 16
    trace.save(tmp_path / "t.tlt")
    loaded = tl.load(tmp_path / "t.tlt")
    assert loaded.edited and "EDITED" in repr(loaded)
    assert loaded.provenance["edits"] == trace.provenance["edits"]
    assert [dict(r) for r in loaded.edits] == [dict(r) for r in trace.edits]
    assert not tl.trace(model, x).edited
    summary = tl.summary(model, x, edits={"blocks.0.mlp": tl.edits.add(steer)})
    assert "EDITED" in str(summary) and "blocks.0.mlp" in str(summary)


def test_an_edited_op_says_so_in_its_repr_and_its_table_row(tmp_path):
    model, x = _net()
    trace = tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.scale(2.0),
                                      "gelu_2": tl.edits.zero(index=(slice(None), 1))})
    module_op = trace[trace.edits[0]["label"]]  # a module site: the op that made its output
    assert module_op.edited and module_op.edits == [trace.edits[0]]
    assert repr(module_op).endswith(
        f", EDITED: scale, change norm {trace.edits[0]['norm']:.4g}>")
    assert trace["gelu_2"].edited and ", EDITED: zero" in repr(trace["gelu_2"])
    others = [op for op in trace if op.label not in (module_op.label, "gelu_2")]
    assert not any(op.edited or "EDITED" in repr(op) for op in others)
    assert not any(op.edited for op in tl.trace(model, x))
    rows = {line.split()[1]: line for line in str(trace).splitlines()[3:-3]
            if len(line.split()) > 2}
    assert f"{module_op.label} EDITED" in rows[module_op.label]
    assert "gelu_2 EDITED" in rows["gelu_2"]
    assert sum("EDITED" in line for line in rows.values()) == 2
    assert f"<td>{module_op.label} EDITED</td>" in trace._repr_html_()
    # a long trace whose edited op lies in the elided middle names it there
    deep = Net(n=12).eval()
    edited = tl.trace(deep, x, edits={"blocks.6.mlp": tl.edits.zero()})
    label = edited.edits[0]["label"]
    assert f"EDITED among them: {label}" in str(edited)
    assert "EDITED among them" in edited._repr_html_()
    trace.save(tmp_path / "t.tlt")  # a loaded trace's op says it too
    assert "EDITED: scale" in repr(tl.load(tmp_path / "t.tlt")[module_op.label])
    if importlib.util.find_spec("pandas") is not None:
        frame = trace.to_pandas()
        assert set(frame.loc[frame["edited"], "label"]) == {module_op.label, "gelu_2"}


def test_run_keeps_the_edits_and_takes_new_ones():
    model, x = _net()
    trace = tl.trace(model, x, edits={"blocks.0.mlp": tl.edits.zero()})
    y = torch.randn_like(x)
    again = trace.run(y)
    assert again.edited and again.edits[0]["site"] == "blocks.0.mlp"
    other = trace.run(y, edits={"blocks.2.mlp": tl.edits.zero()})
    assert [row["site"] for row in other.edits] == ["blocks.2.mlp"]
    clean = trace.run(y, edits=None)
    assert not clean.edited


def test_save_takes_the_same_sites_globs_included():
    model, x = _net()
    trace = tl.trace(model, x, save=["blocks.*.mlp"])
    saved = {op.label for op in trace if op.saved}
    for i in range(3):
        assert trace[f"blocks.{i}.mlp"].calls[0].output_ops[0] in saved
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, save=["blocks.*.attn"])
    assert err.value.code == "save_selection_invalid"


def test_record_takes_edits_and_its_store_lists_them(tmp_path):
    model, x = _net()
    batches = [x, x + 1]
    plain = tl.record(model, batches, save=["blocks.2"])
    edited = tl.record(model, batches, save=["blocks.2"],
                       edits={"blocks.2.mlp": tl.edits.zero()})
    traced = tl.trace(model, x + 1, save=["blocks.2"], edits={"blocks.2.mlp": tl.edits.zero()})
    rows = edited["blocks.2"]  # one row per example: x's two, then x + 1's two
    assert torch.allclose(rows[2:4], traced["blocks.2"].out)
    assert not torch.allclose(rows[2:4], plain["blocks.2"][2:4])
    store = tl.record(model, batches, save=["blocks.2"], to=tmp_path / "acts",
                      edits={"blocks.2.mlp": tl.edits.zero()})
    assert store.manifest["options"]["edits"][0]["kind"] == "zero"
    assert torch.allclose(store["blocks.2"][0:4], rows[0:4])
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, batches, save=["blocks.2"], edits={"relu_1": tl.edits.zero()})
    assert err.value.code == "edit_site_not_fired"


def test_a_star_stays_within_one_part_of_an_address():
    model, x = _net()
    trace = tl.trace(model, x, edits={"blocks.*": tl.edits.scale(1.0)})
    assert [row["module"] for row in trace.edits] == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(row["zero_change"] for row in trace.edits)
    deep = tl.trace(model, x, edits={"blocks.**.0": tl.edits.scale(1.0)})
    assert [row["module"] for row in deep.edits] == [f"blocks.{i}.mlp.0" for i in range(3)]


def test_record_takes_a_glob_as_the_modules_it_matches(tmp_path):
    model, x = _net()
    store = tl.record(model, [x], save=["blocks.*.mlp"], to=tmp_path / "acts")
    assert sorted(store.labels) == ["blocks.0.mlp", "blocks.1.mlp", "blocks.2.mlp"]
    trace = tl.trace(model, x, save=["blocks.1.mlp"])
    assert torch.equal(store["blocks.1.mlp"][0:2], trace["blocks.1.mlp"].out)


class Indices(nn.Module):
    """An integer value in the middle of the forward: the argmax a lookup reads."""

    def __init__(self):
        super().__init__()
        self.fc, self.table = nn.Linear(4, 6), nn.Embedding(6, 3)

    def forward(self, x):
        return self.table(self.fc(x).argmax(-1))


def test_a_value_an_integer_site_cannot_hold_refuses():
    torch.manual_seed(0)
    model, x = Indices().eval(), torch.randn(2, 4)
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"argmax_1": tl.edits.add(torch.tensor([0.5]))})
    assert err.value.code == "edit_dtype_mismatch" and "int64" in err.value.message
    trace = tl.trace(model, x, edits={"argmax_1": tl.edits.replace(torch.tensor([2.0, 5.0]))})
    assert torch.equal(trace.output, model.table(torch.tensor([2, 5])).detach())
