"""``tl.transformer(trace)``: the residual-stream algebra over a captured trace, with
TransformerLens's names, labels and semantics.

Every method reads the names it needs from the trace (``trace["blocks.3.hook_resid_pre"]``);
a value the capture did not keep refuses ``activation_not_saved`` with the ``save=`` that
keeps it. Nothing re-runs. The norms' scales are frozen from the run (``apply_ln_to_stack``
divides by the scale the run's norm computed), and the logit directions are the unembedding's
columns times the final norm's weight, as TransformerLens's folded models have them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, TorchLensError, pandas_for
from ..sites import transformer_names
from .bind import anchor, structure_of


class TransformerView:
    """A captured trace of a transformer, read in the residual stream's terms."""

    def __init__(self, trace: Any):
        model = trace._objects.get("model")
        if model is None:
            raise InputError("tl.transformer needs the trace of a live model (a loaded trace "
                             "holds no model)", code="transformer_needs_model",
                             teach=["tl.transformer(tl.trace(model, x, save='all'))"])
        self.trace, self.model = trace, model
        self.structure = structure_of(model, trace)
        self.n_layers = len(self.structure.blocks)

    @property
    def names(self) -> list[str]:
        """Every transformer name this model has (the ones its architecture lacks left out)."""
        out = []
        for name in transformer_names(self.n_layers):
            try:
                anchor(self.structure, name, self.model)
            except TorchLensError:
                continue
            out.append(name)
        return out

    def _get(self, name: str) -> Tensor:
        return self.trace[name].out

    # ---- stacks of the stream -----------------------------------------------------------
    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False,
                          apply_ln: bool = False, pos_slice: Any = None,
                          mlp_input: bool = False, return_labels: bool = False) -> Any:
        """The stream before each layer up to ``layer`` (``[component, batch, pos, d_model]``;
        labels ``"0_pre"``, ``"0_mid"``, ``"final_post"``); ``layer=None``: every layer and the
        final stream. ``apply_ln`` at the final stream applies the final norm itself to each
        component (its statistics recomputed: the logit lens), elsewhere the run's scale."""
        layer = self.n_layers if layer is None or layer == -1 else layer
        parts, labels = [], []
        for index in range(layer + 1):
            if index == self.n_layers:
                parts.append(self._get(f"blocks.{index - 1}.hook_resid_post"))
                labels.append("final_post")
                continue
            parts.append(self._get(f"blocks.{index}.hook_resid_pre"))
            labels.append(f"{index}_pre")
            if incl_mid and index < layer or mlp_input and index == layer:
                parts.append(self._get(f"blocks.{index}.hook_resid_mid"))
                labels.append(f"{index}_mid")
        stack = self._stack(parts, pos_slice)
        if apply_ln and layer == self.n_layers:
            norm, _ = self._norm(None)
            with torch.no_grad():
                stack = torch.stack([norm(part) for part in stack])
        elif apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice, mlp_input)
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer: int | None = None, mode: str = "all",
                        apply_ln: bool = False, pos_slice: Any = None, mlp_input: bool = False,
                        incl_embeds: bool = True, return_labels: bool = False) -> Any:
        """The stream before ``layer`` as the sum of its writers: the embeddings and each
        layer's attention and MLP outputs (labels ``"embed"``, ``"pos_embed"``,
        ``"0_attn_out"``, ``"0_mlp_out"``); ``mode`` "attn" or "mlp" keeps one kind;
        ``mlp_input``: the stream the MLP of ``layer`` reads (its attention output too)."""
        if mode not in ("all", "attn", "mlp"):
            raise InputError(f"mode={mode!r}: 'all', 'attn' or 'mlp'", code="option_invalid",
                             teach=["tl.transformer(trace).decompose_resid(mode='attn')"])
        layer = self.n_layers if layer is None or layer == -1 else layer
        parts, labels = [], []
        if incl_embeds:
            parts.append(self._get("hook_embed"))
            labels.append("embed")
            if self.structure.pos_embed is not None:
                parts.append(self._get("hook_pos_embed"))
                labels.append("pos_embed")
        for index in range(layer + 1):
            for kind in ("attn", "mlp"):
                if (index < layer or mlp_input and kind == "attn") and mode in ("all", kind):
                    parts.append(self._get(f"blocks.{index}.hook_{kind}_out"))
                    labels.append(f"{index}_{kind}_out")
        stack = self._stack(parts, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice, mlp_input)
        return (stack, labels) if return_labels else stack

    def stack_head_results(self, layer: int = -1, pos_slice: Any = None, apply_ln: bool = False,
                           return_labels: bool = False) -> Any:
        """Each head's output (``hook_result``) of every layer before ``layer`` (-1: all), as
        ``[layer * head, batch, pos, d_model]`` with labels ``"L3H5"``."""
        layer = self.n_layers if layer == -1 else layer
        parts, labels = [], []
        for index in range(layer):
            result = self._get(f"blocks.{index}.attn.hook_result")
            for head in range(result.shape[2]):
                parts.append(result[:, :, head])
                labels.append(f"L{index}H{head}")
        stack = self._stack(parts, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice)
        return (stack, labels) if return_labels else stack

    @staticmethod
    def _stack(parts: list[Tensor], pos_slice: Any) -> Tensor:
        batch = max(p.shape[0] for p in parts)
        return _positions(torch.stack([p.expand(batch, *p.shape[1:]) for p in parts]),
                          pos_slice)

    # ---- norms and logits ---------------------------------------------------------------
    def _norm(self, layer: int | None, mlp_input: bool = False) -> tuple[nn.Module, Tensor]:
        """The norm module that reads the stream at ``layer`` (None or n_layers: the final
        norm; ``mlp_input``: the one before the MLP), and the stream it read in the run."""
        modules = dict(self.model.named_modules())
        if layer is None or layer >= self.n_layers:
            if self.structure.ln_final_module is None:
                raise InputError("the model has no final norm", code="site_not_in_architecture",
                                 teach=["tl.transformer(trace).names"])
            return (modules[self.structure.ln_final_module],
                    self._get(f"blocks.{self.n_layers - 1}.hook_resid_post"))
        block = self.structure.blocks[layer]
        if mlp_input:
            if block.ln2 is None:
                raise InputError(f"block {layer} has no norm before its MLP",
                                 code="site_not_in_architecture",
                                 teach=["tl.transformer(trace).names"])
            return (modules[block.norms[block.ln2]],
                    self._get(f"blocks.{layer}.hook_resid_mid"))
        if block.ln1 is None:
            raise InputError(f"block {layer} has no norm before its attention",
                             code="site_not_in_architecture",
                             teach=["tl.transformer(trace).names"])
        return modules[block.norms[block.ln1]], self._get(f"blocks.{layer}.hook_resid_pre")

    def apply_ln_to_stack(self, stack: Tensor, layer: int | None = None,
                          pos_slice: Any = None, mlp_input: bool = False) -> Tensor:
        """``stack`` (``[..., batch, pos, d_model]``) through the norm at ``layer`` with the
        scale frozen from the run: centred (LayerNorm) and divided by the scale the norm
        computed from the real stream; its weight is left to the readers (``logit_attrs``)."""
        norm, stream = self._norm(layer, mlp_input)
        layer_norm = isinstance(norm, nn.LayerNorm) or "layernorm" in type(norm).__name__.lower() \
            and "rms" not in type(norm).__name__.lower()
        eps = float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", 1e-5))
        x = stream.double()
        if layer_norm:
            x = x - x.mean(-1, keepdim=True)
            stack = stack - stack.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        scale = _positions(scale, pos_slice) if pos_slice is not None else scale
        return (stack.double() / scale).to(stack.dtype)

    def _directions(self, tokens: Any) -> Tensor:
        """The stream directions of ``tokens``' logits: the unembedding's rows times the
        final norm's weight, ``[..., d_model]``."""
        modules = dict(self.model.named_modules())
        if self.structure.unembed is None:
            raise InputError("the model has no unembedding after its last block",
                             code="site_not_in_architecture",
                             teach=["tl.transformer(trace).names"])
        weight = modules[self.structure.unembed].weight.detach()  # (vocab, d_model)
        norm, _ = self._norm(None)
        if getattr(norm, "weight", None) is not None:
            scale = norm.weight.detach()
            weight = weight * (1 + scale if _offset_weight(norm) else scale)
        return weight[torch.as_tensor(tokens, device=weight.device)]

    def logit_attrs(self, stack: Tensor, tokens: Any, incorrect_tokens: Any = None,
                    pos_slice: Any = None) -> Tensor:
        """Each component's direct contribution to ``tokens``' logits (minus
        ``incorrect_tokens``', when given), ``[component, batch(, pos)]``: as TransformerLens's
        ``ActivationCache.logit_attrs``, ``stack`` (not normed; already sliced to ``pos_slice``,
        which picks the run's final-norm scale) goes through ``apply_ln_to_stack`` at the final
        norm and is dotted with the logit directions. The directions are the unembedding's
        rows times the final norm's weight (what a folded model's ``W_U`` holds), so the
        attributions add up, with the norm's bias term, to the logit (difference) itself."""
        directions = self._directions(tokens)
        if incorrect_tokens is not None:
            wrong = self._directions(incorrect_tokens)
            if wrong.shape != directions.shape:
                raise InputError(
                    f"tokens {list(directions.shape[:-1])} and incorrect_tokens "
                    f"{list(wrong.shape[:-1])} differ in shape", code="option_invalid",
                    teach=["view.logit_attrs(stack, tokens=ids[:, -1], incorrect_tokens=other)"])
            directions = directions - wrong
        stack = self.apply_ln_to_stack(stack, None, pos_slice)
        if directions.dim() == 2 and stack.dim() == 4 and directions.shape[0] == stack.shape[1]:
            directions = directions[:, None, :]  # one token per row: at each position
        return (stack * directions.to(stack.dtype)).sum(-1)

    def logit_lens(self, k: int = 5, layers: str = "resid_post") -> LogitLens:
        """Each layer's stream (``layers``: "resid_pre" or "resid_post") through the final norm
        and the unembedding: the top ``k`` tokens at each position, as a table."""
        modules = dict(self.model.named_modules())
        norm, _ = self._norm(None)
        if self.structure.unembed is None:
            raise InputError("the model has no unembedding", code="site_not_in_architecture",
                             teach=["tl.transformer(trace).names"])
        unembed = modules[self.structure.unembed]
        rows = []
        with torch.no_grad():
            for layer in range(self.n_layers):
                stream = self._get(f"blocks.{layer}.hook_{layers}")
                probs = torch.softmax(unembed(norm(stream)).double(), -1)
                top = probs.topk(k, dim=-1)
                for row in range(stream.shape[0]):
                    for pos in range(stream.shape[1]):
                        rows.append({"layer": layer, "batch": row, "pos": pos,
                                     "tokens": top.indices[row, pos].tolist(),
                                     "probs": [round(p, 6) for p in
                                               top.values[row, pos].tolist()]})
        return LogitLens(rows, self.trace._objects.get("tokenizer"))


def _offset_weight(norm: nn.Module) -> bool:
    """Gemma's RMSNorm multiplies by ``1 + weight``."""
    return "gemma" in type(norm).__name__.lower()


def _positions(stack: Tensor, pos_slice: Any) -> Tensor:
    """``stack`` (``[..., batch, pos, d]``) at the positions ``pos_slice`` (an int keeps the
    axis out, as TransformerLens's Slice does)."""
    if pos_slice is None:
        return stack
    return stack[..., pos_slice, :]


class LogitLens:
    """The logit lens as a table: one row per layer and position, with the top tokens (decoded
    when the trace knows a tokenizer) and their probabilities."""

    def __init__(self, rows: list[dict[str, Any]], tokenizer: Any = None):
        self.rows = rows
        if tokenizer is not None and hasattr(tokenizer, "decode"):
            for row in rows:
                row["text"] = [tokenizer.decode([t]) for t in row["tokens"]]

    def to_pandas(self) -> Any:
        return pandas_for("lens.to_pandas()", "lens.rows  # the same rows").DataFrame(self.rows)

    def to_html(self) -> str:
        """A heatmap: layers down, positions across, each cell the top token, shaded by its
        probability."""
        from html import escape

        layers = sorted({r["layer"] for r in self.rows})
        positions = sorted({r["pos"] for r in self.rows if r["batch"] == 0})
        cell = {(r["layer"], r["pos"]): r for r in self.rows if r["batch"] == 0}
        head = "".join(f"<th>{p}</th>" for p in positions)
        body = []
        for layer in layers:
            cells = []
            for pos in positions:
                row = cell[(layer, pos)]
                p = row["probs"][0]
                token = row.get("text", row["tokens"])[0]
                cells.append(f'<td style="background: rgba(49,130,206,{p:.3f})" '
                             f'title="{p:.4f}">{escape(str(token))}</td>')
            body.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
        return (f"<table class='logit-lens'><tr><th>layer \\ pos</th>{head}</tr>"
                f"{''.join(body)}</table>")

    def save(self, path: str) -> None:
        """Write the heatmap as an HTML page."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"<!doctype html><meta charset='utf-8'><title>logit lens</title>"
                    f"{self.to_html()}")

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"<LogitLens {len(self.rows)} rows>"


def transformer(trace: Any) -> TransformerView:
    """The residual-stream view of a transformer's trace (see ``TransformerView``)."""
    return TransformerView(trace)
