"""A transformer's anatomy, read from one capture's op graph and module tree.

The block list is the longest list of repeated modules; inside each block call the residual
stream is followed op by op (an ``add`` with the stream as one parent is a residual add; a
norm that alone reads one carries the stream on, as post-LN models do), the attention op is the
``scaled_dot_product_attention`` call (or an eager softmax followed by a matmul), the norms are
the norm modules in call order. Plugin hints (``torchlens_transformer_hints``) may name head
counts and parallel residuals; the graph decides, and a disagreement refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import InputError
from ..sites import name_of

ADDS = {"add", "__add__", "__radd__", "add_", "__iadd__"}
# ops that only move a value (no arithmetic): followed when walking from an op to its source
LAYOUT = {"view", "reshape", "transpose", "permute", "contiguous", "split", "chunk", "getitem",
          "unflatten", "flatten", "to", "clone", "cat", "expand", "unsqueeze", "squeeze",
          "__getitem__", "unbind", "narrow", "dropout"}
SAME = {"to", "contiguous", "detach", "type_as", "view_as", "float"}  # may return their input
ACTIVATIONS = {"gelu", "silu", "relu", "tanh", "sigmoid", "gelu_new", "mish", "softplus",
               "quick_gelu", "elu", "leaky_relu", "hardswish", "selu"}


@dataclass
class Attention:
    """One block's attention: where q, k, v, the scores, the pattern and z live."""

    kind: str  # "sdpa" (a fused call: scores and pattern are recomputed from it) or "eager"
    op: str  # the sdpa op; for eager, the softmax op
    q: str | None  # the op feeding the attention as q, (batch, head, pos, d_head)
    k: str | None
    v: str | None
    z: str  # the attention's output per head, (batch, head, pos, d_head)
    scores: str | None = None  # eager: the softmax's input
    q_proj: str | None = None  # the output ops of q, k, v's own projections (None when fused)
    k_proj: str | None = None
    v_proj: str | None = None
    out_proj: str | None = None  # the module reading z, merged, back to the stream
    rotary: bool = False  # q and k were rotated between their projection and the attention
    n_heads: int = 0
    n_kv_heads: int = 0
    d_head: int = 0


@dataclass
class Block:
    """One block: the op labels and module addresses each name of the vocabulary resolves to,
    and why a name has none."""

    layer: int
    address: str
    resid_pre: str
    resid_post: str
    resid_mid: str | None = None
    attn_out: str | None = None
    mlp_out: str | None = None
    ln1: str | None = None  # module calls' output ops (the normalized value)
    ln2: str | None = None
    attention: Attention | None = None
    mlp_pre: str | None = None
    mlp_post: str | None = None
    norms: dict[str, str] = field(default_factory=dict)  # a norm's output op -> its module
    missing: dict[str, str] = field(default_factory=dict)  # hook -> why it is not here


@dataclass
class Structure:
    """A transformer read from its graph: blocks in order and the model-level sites."""

    blocks_address: str
    blocks: list[Block]
    embed: str | None = None  # op labels
    pos_embed: str | None = None
    ln_final: str | None = None
    ln_final_module: str | None = None
    unembed: str | None = None  # the module whose output is the logits
    batch: int = 1  # rows of the stream
    missing: dict[str, str] = field(default_factory=dict)


def block_list(model: nn.Module) -> tuple[str, list[str]] | None:
    """(address, child addresses) of the longest list of repeated blocks: a container whose
    children are numbered 0..n-1 and share one class; None when there is none."""
    best: tuple[int, int, str, list[str]] | None = None
    for address, module in model.named_modules():
        children = list(module.named_children())
        if len(children) < 1 or not all(name.isdigit() for name, _ in children):
            continue
        kinds = {type(m) for _, m in children}
        if len(kinds) != 1 or not any(True for _ in children[0][1].children()):
            continue
        size = sum(p.numel() for p in module.parameters())
        key = (len(children), size)
        if best is None or key > best[:2]:
            best = (*key, address, [f"{address}.{name}" if address else name
                                    for name, _ in children])
    return None if best is None else (best[2], best[3])


def read(trace: Any, model: nn.Module, hints: dict[str, list[Any]] | None = None
         ) -> Structure:
    """The structure of ``model`` from ``trace`` (a capture of it, values not needed)."""
    found = block_list(model)
    if found is None:
        raise InputError(
            f"{type(model).__name__} has no list of repeated blocks, so it has no "
            "transformer names (blocks.{L}....)", code="site_not_in_architecture",
            teach=["tl.trace(model, x, save=['<module address>'])  # name modules instead",
                   "list(tl.trace(model, x, save=None).modules)"])
    address, children = found
    types = {a: m.type for a, m in trace.modules.items()}
    graph = _Graph(trace)
    blocks = []
    for layer, child in enumerate(children):
        module = trace.modules.get(child)
        if module is None or not module.calls:
            raise InputError(f"block {child} never ran in this forward", code="site_not_in_"
                             "architecture", teach=["tl.trace(model, x, save=None).modules"])
        blocks.append(_block(layer, child, module.calls[0], graph, types, model, hints or {}))
    structure = Structure(address, blocks, batch=trace[blocks[0].resid_pre].shape[0])
    _ends(structure, graph, types, trace, hints or {})
    return structure


class _Graph:
    """The trace's ops by label, with each op's consumers."""

    def __init__(self, trace: Any):
        self.ops = {op.label: op for op in trace}
        self.order = {op.label: i for i, op in enumerate(trace)}

    def source(self, label: str) -> str:
        """Walking back from ``label`` through ops that only move values: the first op that
        computes."""
        op = self.ops[label]
        while op.func in LAYOUT and op.parents:
            made = [p for p in op.parents if self.ops[p].shape and self.ops[p].shape != [0]]
            if len(made) != 1:
                break
            op = self.ops[made[0]]
        return op.label


def _is_norm(type_name: str) -> bool:
    return "norm" in type_name.lower()


def _inside(module: str, address: str) -> bool:
    return module == address or module.startswith(address + ".")


def _block(layer: int, address: str, call: Any, graph: _Graph, types: dict[str, str],
           model: nn.Module, hints: dict[str, Any]) -> Block:
    ops = [graph.ops[label] for label in call.ops]
    inside = set(call.ops)
    out_label = call.output_ops[0]
    out_shape = graph.ops[out_label].shape
    outside = [p for op in ops for p in op.parents if p not in inside]
    stream_in = next((p for p in outside if graph.ops[p].shape == out_shape), None)
    if stream_in is None:
        raise InputError(f"block {address}: no input of the output's shape {out_shape}",
                         code="site_not_in_architecture", teach=[f"trace[{address!r}]"])
    block = Block(layer, address, resid_pre=stream_in, resid_post=out_label)
    # follow the stream: residual adds (an add of the stream's shape reading the stream, or
    # the output of a norm that read it, as post-LN models add), aliases of the stream
    stream, normed, adds, norms = {stream_in}, set(), [], []
    for op in ops:
        if op.func in SAME and len(op.parents) == 1 and op.parents[0] in stream:
            stream.add(op.label)  # ``x.to(float32)`` of a float32 x is x itself
        elif op.func in ADDS and len(op.parents) == 2 and op.shape == out_shape and not (
                stream | normed).isdisjoint(op.parents):
            adds.append((op, stream | normed))
            stream, normed = {op.label}, set()
        elif _is_norm(types.get(op.module, "")) and not stream.isdisjoint(op.parents):
            normed.add(_module_output(op.module, ops) or op.label)
    for op in ops:
        if _is_norm(types.get(op.module, "")) and op.module != address and \
                op.module in _outputs_of(op):
            norms.append(op.label)
            block.norms[op.label] = op.module
    if len(adds) == 2:
        block.resid_mid, block.resid_post = adds[0][0].label, adds[1][0].label
        block.attn_out, block.mlp_out = _other(*adds[0]), _other(*adds[1])
    elif len(adds) == 1:
        block.resid_post = adds[0][0].label
        block.missing["hook_resid_mid"] = (
            "attention and MLP read the same stream in parallel (one residual add per block), "
            "so there is no stream between them")
    else:
        block.missing["hook_resid_mid"] = block.missing["hook_resid_post"] = (
            f"found {len(adds)} residual adds in {address}, not 1 or 2")
    for said in hints.get("parallel_residual", ()):
        if bool(said) == (len(adds) == 1):
            continue
        raise InputError(
            f"a plugin's hint says parallel_residual={said}, but the "
            f"graph of {address} has {len(adds)} residual adds", code="transformer_hint_disagrees",
            teach=["tl.trace(model, x, save=None)[" + repr(address) + "]  # read the block"])
    if len(norms) in (2, 4):
        block.ln1, block.ln2 = norms[0], norms[len(norms) // 2]
    else:
        block.missing["ln1.hook_normalized"] = block.missing["ln2.hook_normalized"] = (
            f"{address} calls {len(norms)} norm modules, not 2 or 4")
    block.attention = _attention(ops, address, graph, types, model, hints)
    if block.attention is None:
        block.missing["attn"] = f"no attention op (scaled_dot_product_attention or softmax) " \
                                f"in {address}"
    else:
        attn_module = _child_of(address, graph.ops[block.attention.op].module)
        if block.attn_out is None and attn_module:
            block.attn_out = _module_output(attn_module, ops)
        mlp = _mlp(ops, address, attn_module, types, graph, model)
        if mlp is not None:
            block.mlp_pre, block.mlp_post, mlp_address = mlp
            if block.mlp_out is None:
                block.mlp_out = _module_output(mlp_address, ops)
    for hook, label in (("hook_attn_out", block.attn_out), ("hook_mlp_out", block.mlp_out),
                        ("mlp.hook_pre", block.mlp_pre), ("mlp.hook_post", block.mlp_post)):
        if label is None:
            block.missing.setdefault(hook, f"not found in the graph of {address}")
    return block


def _other(add: Any, stream: set[str]) -> str:
    """The parent of a residual add that is not the stream: the branch's output."""
    other = [p for p in add.parents if p not in stream]
    return other[0] if other else add.parents[0]


def _child_of(block: str, module: str) -> str | None:
    """The direct child of ``block`` that holds ``module`` (or None when it is the block)."""
    if not module.startswith(block + "."):
        return None
    return block + "." + module[len(block) + 1:].split(".")[0]


def _outputs_of(op: Any) -> set[str]:
    """The modules whose call returned this op's output."""
    return {name_of(key) for key in op.module_outputs or ()}


def _module_output(address: str, ops: list) -> str | None:
    for op in ops:
        if address in _outputs_of(op):
            return op.label
    return None


def _linears(ops: list, within: str, graph: _Graph, model: nn.Module) -> list[tuple[str, str]]:
    """(module address, output op) of each projection (a module with a 2-d weight) called
    inside ``within``, in call order."""
    out: list[tuple[str, str]] = []
    seen = set()
    modules = dict(model.named_modules())
    for op in ops:
        for key in op.module_outputs or ():
            address = name_of(key)
            if address in seen or not _inside(address, within) or address == within:
                continue
            weight = getattr(modules.get(address), "weight", None)
            if weight is not None and weight.dim() == 2 and not isinstance(
                    modules[address], nn.Embedding):
                seen.add(address)
                out.append((address, op.label))
    return out


def _attention(ops: list, block: str, graph: _Graph, types: dict[str, str], model: nn.Module,
               hints: dict[str, Any]) -> Attention | None:
    sdpa = next((op for op in ops if op.func == "scaled_dot_product_attention"), None)
    if sdpa is not None:
        if len(sdpa.parents) < 3:
            return None
        q, k, v = sdpa.parents[:3]
        att = Attention("sdpa", sdpa.label, q, k, v, sdpa.label)
    else:
        soft = next((op for op in ops if op.func in ("softmax", "_softmax")), None)
        if soft is None:
            return None
        after = soft
        while len(after.children) == 1 and graph.ops[after.children[0]].func in LAYOUT:
            after = graph.ops[after.children[0]]
        z = next((graph.ops[c] for c in after.children if graph.ops[c].func in
                  ("matmul", "bmm", "einsum", "__matmul__")), None)
        scores = soft.parents[0] if soft.parents else None
        if z is None or scores is None:
            return None
        v = next((p for p in z.parents if p != after.label), None)
        qk = graph.ops[scores]
        while qk.func not in ("matmul", "bmm", "einsum", "__matmul__") and qk.parents:
            qk = graph.ops[qk.parents[0]]
        q, k = (qk.parents + [None, None])[:2] if qk.func in ("matmul", "bmm") else (None, None)
        att = Attention("eager", soft.label, q, k, v, z.label, scores=scores)
    attn_module = _child_of(block, graph.ops[att.op].module) or block
    z_shape = graph.ops[att.z].shape
    att.n_heads, att.d_head = z_shape[1], z_shape[-1]
    linears = _linears([op for op in ops if _inside(op.module, attn_module)], attn_module, graph,
                       model)
    z_at = graph.order[att.z]
    after = [(a, o) for a, o in linears if graph.order[o] > z_at]
    before = [(a, o) for a, o in linears if graph.order[o] < z_at]
    att.out_proj = after[0][0] if after else None
    names = {a.rpartition(".")[2]: o for a, o in before}
    for role, keys in (("q", ("q_proj", "query", "q", "q_lin")), ("k", ("k_proj", "key", "k",
                       "k_lin")), ("v", ("v_proj", "value", "v", "v_lin"))):
        setattr(att, f"{role}_proj", next((names[key] for key in keys if key in names), None))
    if att.k_proj is not None:
        att.n_kv_heads = graph.ops[att.k_proj].shape[-1] // att.d_head
    elif att.k is not None:
        att.n_kv_heads = graph.ops[att.k].shape[1]
    else:
        att.n_kv_heads = att.n_heads
    for role in ("k", "v"):  # under GQA, before the kv heads were repeated for the attention
        label = getattr(att, role)
        if label is not None and graph.ops[label].shape[1] != att.n_kv_heads:
            source = graph.source(label)
            if graph.ops[source].shape[1] == att.n_kv_heads:
                setattr(att, role, source)
    if att.q is not None:  # rotated: an arithmetic op between the projection and the attention
        start = graph.source(att.q)
        att.rotary = graph.ops[start].func not in ("linear", "addmm", "matmul", "bmm") and \
            _outputs_of(graph.ops[start]).isdisjoint(a for a, _ in before)
    for key, want in (("n_heads", att.n_heads), ("n_kv_heads", att.n_kv_heads),
                      ("d_head", att.d_head)):
        for said in hints.get(key, ()):
            if int(said) == want:
                continue
            raise InputError(
                f"a plugin's hint says {key}={said}, but the attention in {block} has {want}",
                code="transformer_hint_disagrees",
                teach=[f"tl.trace(model, x, save=None)[{att.op!r}]  # the attention op"])
    return att


def _mlp(ops: list, block: str, attn_module: str | None, types: dict[str, str], graph: _Graph,
         model: nn.Module) -> tuple[str, str, str] | None:
    """(hook_pre op, hook_post op, the MLP's address): the activation's input, and the input of
    the MLP's last projection."""
    children = []
    for op in ops:
        child = _child_of(block, op.module)
        if child and child != attn_module and not _is_norm(types.get(child, "")) and \
                child not in children:
            children.append(child)
    for child in children:
        inner = [op for op in ops if _inside(op.module, child)]
        linears = _linears(inner, child, graph, model)
        if len(linears) < 2:
            continue
        last_address, last_out = linears[-1]
        last_ops = [op for op in inner if _inside(op.module, last_address)]
        post = next((p for p in last_ops[0].parents if p not in {o.label for o in last_ops}),
                    None)
        act = next((op for op in inner if op.func in ACTIVATIONS or _is_act(op, types)), None)
        if post is None or act is None:
            continue
        act_in = next((p for p in act.parents), None)
        if act_in is None:
            continue
        # a composite activation (GPT-2's tanh GELU) starts at the activation module's input
        act_module = act.module if _is_act(act, types) else None
        if act_module:
            first = next(op for op in inner if op.module == act_module)
            act_in = first.parents[0]
        return act_in, post, child
    return None


def _is_act(op: Any, types: dict[str, str]) -> bool:
    name = types.get(op.module, "")
    return bool(re.search(r"gelu|silu|relu|activation|swish|tanh", name, re.I))


def _ends(structure: Structure, graph: _Graph, types: dict[str, str], trace: Any,
          hints: dict[str, Any]) -> None:
    """The embedding, position embedding, final norm and unembedding around the blocks."""
    first = structure.blocks[0]
    start = graph.order[first.resid_pre]
    before = [op for op in trace if graph.order[op.label] <= start]
    embeds = [op for op in before if op.func == "embedding"]
    from_input = [op for op in embeds if _reaches_input(op, graph)]
    token = next((op for op in from_input if _hint(hints, "embed") in (None, op.module)), None)
    if token is None:
        structure.missing["hook_embed"] = "no embedding of the input ids before the first block"
    else:
        structure.embed = token.label
    positions = [op for op in embeds if op not in from_input]
    if _hint(hints, "pos_embed"):
        positions = [op for op in positions if op.module == _hint(hints, "pos_embed")]
    if len(positions) == 1:
        structure.pos_embed = positions[0].label
    else:
        structure.missing["hook_pos_embed"] = (
            "the model has no learned position embedding (rotary or no positions)"
            if not positions else f"{len(positions)} position embeddings")
    last = structure.blocks[-1]
    end = graph.ops[_block_output(last, trace)]
    norm = None
    for child in end.children:
        op = graph.ops[child]
        if _is_norm(types.get(op.module, "")):
            norm = op
            break
    if norm is None:
        structure.missing["ln_final.hook_normalized"] = "no norm reads the last block's output"
    else:
        structure.ln_final_module = norm.module
        structure.ln_final = next(op.label for op in trace if norm.module in _outputs_of(op))
    unembed = _hint(hints, "unembed")
    logits = [op for op in trace if op.func == "linear" and graph.order[op.label] >
              graph.order[end.label]]
    if unembed:
        logits = [op for op in logits if op.module == unembed]
    if logits:
        structure.unembed = logits[-1].module
    else:
        structure.missing["unembed"] = "no projection to the vocabulary after the last block"


def _hint(hints: dict[str, list[Any]], key: str) -> Any:
    """The first plugin's hint for ``key`` (an address), or None."""
    return (hints.get(key) or [None])[0]


def _block_output(block: Block, trace: Any) -> str:
    call = trace.modules[block.address].calls[0]
    return call.output_ops[0]


def _reaches_input(op: Any, graph: _Graph) -> bool:
    """Whether an op's value derives from a model input (token ids, not positions)."""
    todo, seen = list(op.parents), set()
    while todo:
        label = todo.pop()
        if label in seen:
            continue
        seen.add(label)
        node = graph.ops[label]
        if node.kind == "input":
            return True
        todo.extend(node.parents)
    return False
