"""Transformer names through ``flex_attention``: hook_attn_scores and hook_pattern recomputed
from the call (its score_mod and its block mask's mask_mod over the whole grid, GQA's repeat)
equal the same model's eager softmax, an edited pattern recomputes the call as ``pattern @ v``
exactly as editing the eager softmax does, and a call whose mods cannot be evaluated again
refuses typed instead of giving a pattern that is not the call's.

Hugging Face's ``attn_implementation="flex_attention"`` always wraps flex_attention in
``torch.compile`` (about 17 s on CPU for a two-layer Llama) and its CPU kernel refuses inputs that
need grad, so these models are hand-written, call flex_attention eagerly and hold parameters
that need no grad. Run without torch.compile, flex_attention still compiles its call with
dynamo's eager backend, tracing the capture's torch-function mode with it: the first call of a
process may come inside a capture, which records the call (its higher-order op) as one op."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torchlens as tl
from torchlens.errors import TorchLensError

ATOL = 1e-6
SEQ, D_MODEL, HEADS, D_HEAD, LAYERS = 6, 16, 4, 4, 2
CAP = 2.0  # a soft cap on the logits, tanh before the softmax (Gemma 2's)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def slopes(heads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** -(i + 1) for i in range(heads)])


class Attention(nn.Module):
    """Causal attention with a soft cap and an ALiBi bias: ``flex`` calls flex_attention with
    them as score_mod and a causal block mask; ``eager`` computes the same by hand (its softmax
    is the pattern to compare with)."""

    def __init__(self, kv_heads: int, flex: bool):
        super().__init__()
        self.kv_heads, self.flex = kv_heads, flex
        self.q_proj = nn.Linear(D_MODEL, HEADS * D_HEAD)
        self.k_proj = nn.Linear(D_MODEL, kv_heads * D_HEAD)
        self.v_proj = nn.Linear(D_MODEL, kv_heads * D_HEAD)
        self.o_proj = nn.Linear(HEADS * D_HEAD, D_MODEL)
        self.slopes = slopes(HEADS)
        self.patterns: list[torch.Tensor] = []  # the eager softmax, as it ran
        self.pattern_edit = None  # a function of the eager softmax
        self.pad: torch.Tensor | None = None  # [batch, key] bias: left padding, read by index

    def score_mod(self, score, b, h, q_idx, kv_idx):
        score = CAP * torch.tanh(score / CAP)
        if self.pad is not None:  # indexed by the grid, as Hugging Face's score_mod reads masks
            score = score + self.pad[b, kv_idx]
        return score - self.slopes[h] * (q_idx - kv_idx)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, HEADS, D_HEAD).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, D_HEAD).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, D_HEAD).transpose(1, 2)
        if self.flex:
            mask = create_block_mask(causal, None, None, seq, seq, device="cpu")
            z = flex_attention(q, k, v, score_mod=self.score_mod, block_mask=mask,
                               enable_gqa=self.kv_heads != HEADS)
        else:
            group = HEADS // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = q @ k.transpose(-1, -2) / D_HEAD ** 0.5
            scores = CAP * torch.tanh(scores / CAP)
            pos = torch.arange(seq)
            scores = scores - self.slopes[:, None, None] * (pos[:, None] - pos[None, :])
            if self.pad is not None:
                scores = scores + self.pad[:, None, None, :]
            scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
            pattern = torch.softmax(scores, dim=-1)
            if self.pattern_edit is not None:
                pattern = self.pattern_edit(pattern)
            self.patterns.append(pattern.detach().clone())
            z = pattern @ v
        return self.o_proj(z.transpose(1, 2).reshape(batch, seq, HEADS * D_HEAD))


class Block(nn.Module):
    def __init__(self, kv_heads: int, flex: bool):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.self_attn = Attention(kv_heads, flex)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 32), nn.GELU(), nn.Linear(32, D_MODEL))

    def forward(self, x):
        x = x + self.self_attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    """A causal decoder (modules named as Llama's: ``layers.{L}.self_attn``; a model whose
    module addresses spell TransformerLens names, ``blocks.*.attn.*``, is read by them)."""

    def __init__(self, kv_heads: int = HEADS, flex: bool = True):
        super().__init__()
        self.embed = nn.Embedding(50, D_MODEL)
        self.layers = nn.ModuleList(Block(kv_heads, flex) for _ in range(LAYERS))
        self.ln_final = nn.LayerNorm(D_MODEL)
        self.unembed = nn.Linear(D_MODEL, 50, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.unembed(self.ln_final(x))


def pair(kv_heads: int = HEADS, padded: bool = False) -> tuple[Model, Model, torch.Tensor]:
    """The flex model and its eager twin (the same weights), and token ids (``padded``: the
    second row's first two tokens are padding, masked by a bias the score_mod indexes)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        flex = Model(kv_heads, flex=True).eval()
    flex.requires_grad_(False)  # flex_attention's CPU kernel has no backward and refuses grads
    eager = Model(kv_heads, flex=False).eval()
    eager.load_state_dict(flex.state_dict())
    if padded:
        pad = torch.zeros(2, SEQ)
        pad[1, :2] = -1e4
        for model in (flex, eager):
            for layer in model.layers:
                layer.self_attn.pad = pad
    ids = torch.randint(0, 50, (2, SEQ), generator=torch.Generator().manual_seed(3))
    return flex, eager, ids


def eager_scores(eager: Model, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The eager twin's masked, capped, biased scores of one layer (the softmax's input)."""
    trace = tl.trace(eager, ids, save="all")
    soft = next(op for op in trace if op.func == "softmax"
                and op.module == f"layers.{layer}.self_attn")
    return trace[soft.parents[0]].out


def close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize(("kv_heads", "padded"), [(HEADS, False), (2, False), (2, True)],
                         ids=["mha", "gqa", "gqa-padded"])
def test_flex_patterns_equal_the_eager_softmax(kv_heads, padded):
    flex, eager, ids = pair(kv_heads, padded)
    trace = tl.trace(flex, ids, save=["blocks.*.attn.*"])
    with torch.no_grad():
        eager(ids)
    for layer in range(LAYERS):
        assert trace[f"blocks.{layer}.attn.hook_pattern"].label.startswith("flex_attention")
        pattern = trace[f"blocks.{layer}.attn.hook_pattern"].out
        assert pattern.shape == (2, HEADS, SEQ, SEQ)
        close(pattern, eager.layers[layer].self_attn.patterns[0])
        seen = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()  # the causal block mask
        assert (pattern[..., ~seen] == 0).all() and (pattern[0][..., seen] > 0).all()
        if padded:  # the padded keys are unread where a query sees another key
            assert (pattern[1, :, 2:, :2] == 0).all() and (pattern[1, :, 2:, 2:][
                ..., seen[2:, 2:]] > 0).all()
        scores = trace[f"blocks.{layer}.attn.hook_attn_scores"].out
        want = eager_scores(eager, ids, layer)
        assert torch.equal(torch.isinf(scores), torch.isinf(want))
        close(scores[~torch.isinf(scores)], want[~torch.isinf(want)])
        distance = torch.arange(SEQ)[:, None] - torch.arange(SEQ)[None, :]
        capped = scores + slopes(HEADS)[:, None, None] * distance  # the ALiBi bias taken off
        assert capped[0][..., seen].abs().max() <= CAP  # the soft cap was applied
        z = trace[f"blocks.{layer}.attn.hook_z"].out
        assert z.shape == (2, SEQ, HEADS, D_HEAD)
        k, v = (trace[f"blocks.{layer}.attn.hook_{r}"].out for r in "kv")
        assert k.shape == v.shape == (2, SEQ, kv_heads, D_HEAD)
        group = v.transpose(1, 2).repeat_interleave(HEADS // kv_heads, dim=1)
        close((pattern @ group).transpose(1, 2), z)  # the pattern is the call's own


FIRST_CALL = """
import torch, torchlens as tl
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)

    def forward(self, x):
        q = self.q(x).view(1, 8, 2, 8).transpose(1, 2)
        mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 2, 8, 8, device="cpu")
        return flex_attention(q, q, q, block_mask=mask)

model = Attention().eval().requires_grad_(False)
x = torch.randn(1, 8, 16)
trace = tl.trace(model, x, save=["flex_attention_1"])
print(torch.equal(trace["flex_attention_1"].out[0], model(x)))
"""


def test_a_process_first_flex_call_inside_a_capture_is_recorded():
    """flex_attention compiles its first call of a process even when run eagerly, with the
    capture's mode on the stack: the capture records that call as it records later ones."""
    import subprocess
    import sys

    from tests.launch import ROOT, child_env

    done = subprocess.run([sys.executable, "-c", FIRST_CALL], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True"]


def test_flex_patterns_cost_nothing_unless_named(monkeypatch):
    from torchlens.anatomy import lens

    flex, _, ids = pair()
    calls = []
    scores = lens.flex_scores
    monkeypatch.setattr(lens, "flex_scores", lambda call: calls.append(1) or scores(call))
    tl.trace(flex, ids, save="all")
    tl.trace(flex, ids, save=["blocks.*.attn.hook_z", "blocks.*.hook_resid_post"])
    assert calls == []
    tl.trace(flex, ids, save=["blocks.0.attn.hook_pattern"])
    assert len(calls) == 1


def test_flex_pattern_edit_equals_the_eager_softmax_edit():
    flex, eager, ids = pair(kv_heads=2)

    def zero_key(pattern):  # head 1 of layer 1 never reads key position 0
        pattern = pattern.clone()
        pattern[:, 1, :, 0] = 0
        return pattern

    with torch.no_grad():
        clean = flex(ids)
        eager.layers[1].self_attn.pattern_edit = zero_key
        want = eager(ids)
    every = slice(None)
    edited = tl.trace(flex, ids, edits={"blocks.1.attn.hook_pattern": tl.edits.zero(
        index=(every, every, every, 0), head=1)})
    close(edited.output, want, atol=1e-5)
    assert not torch.allclose(want, clean, atol=1e-3)
    row = edited.meta["edits"]["fired"][0]
    assert row["site"] == "blocks.1.attn.hook_pattern"
    assert row["label"].startswith("flex_attention")
    pattern = tl.trace(flex, ids, save=["blocks.1.attn.hook_pattern"])[
        "blocks.1.attn.hook_pattern"].out
    replaced = tl.trace(flex, ids, edits={
        "blocks.1.attn.hook_pattern": tl.edits.replace(zero_key(pattern))},
        save=["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"])
    close(replaced.output, want, atol=1e-5)
    # the trace holds the pattern the model went on with, the scores as they were
    close(replaced["blocks.1.attn.hook_pattern"].out, eager.layers[1].self_attn.patterns[-1])
    scores = replaced["blocks.1.attn.hook_attn_scores"].out
    close(torch.softmax(scores, dim=-1), pattern)


class OneShot:
    """A score_mod fed from a queue its forward fills for each call (a per-call bias): flex
    attention's own evaluation consumes the entry, so evaluating it again finds the queue empty
    and, ``empty="raise"``, raises, or else adds a bias the call never had."""

    def __init__(self, attn: Attention, empty: str):
        self.mod, self.empty, self.queue = attn.score_mod, empty, []
        forward = attn.forward

        def feeding(x):
            self.queue[:] = [torch.tensor(0.0)]
            return forward(x)

        attn.forward, attn.score_mod = feeding, self

    def __call__(self, score, b, h, q_idx, kv_idx):
        score = self.mod(score, b, h, q_idx, kv_idx)
        if self.queue:
            return score + self.queue.pop()
        if self.empty == "raise":
            raise IndexError("the bias queue is empty")
        return score + 0.5 * kv_idx


def refusal(flex, ids, name):
    with pytest.raises(TorchLensError) as caught:
        tl.trace(flex, ids, save=[name])
    err = caught.value
    while not err.code.startswith("site") and isinstance(err.__cause__, TorchLensError):
        err = err.__cause__
    return err


def test_flex_mod_that_cannot_run_again_refuses_typed():
    flex, _, ids = pair()
    OneShot(flex.layers[0].self_attn, "raise")
    tl.trace(flex, ids, save=["blocks.0.attn.hook_z"])  # the model runs; only the pattern
    err = refusal(flex, ids, "blocks.0.attn.hook_pattern")  # cannot be recomputed
    assert err.code == "site_not_in_architecture"
    assert "score_mod" in str(err) and "IndexError" in str(err) and err.teach


def test_flex_mod_reading_changed_state_refuses_typed():
    flex, _, ids = pair()
    OneShot(flex.layers[0].self_attn, "bias")
    err = refusal(flex, ids, "blocks.0.attn.hook_attn_scores")
    assert err.code == "site_not_in_architecture"
    assert "differs from the call's output" in str(err)
