"""A transformer's anatomy, read from one capture's op graph and module tree.

The block list is the longest list of repeated modules; inside each block call the residual
stream is followed op by op, through its reshapes (an ``add`` with the stream as one parent is a
residual add; a norm that alone reads one carries the stream on, as post-LN models do; a second
add whose branch never read the first is a parallel block's, Cohere's ``x + attn + mlp``). The
attention op is the ``scaled_dot_product_attention`` or ``flex_attention`` call (or an eager
softmax followed by a matmul, heads folded into the batch or not); ln1 and ln2 are the norms
that read the stream (not those of q and k, or of a branch's output); the MLP is the
projections after the attention with an activation between them, in one module or not (a
mixture of experts refuses). A value that is one piece of a split op is never an anchor: the
graph does not say which piece. Plugin hints (``torchlens_transformer_hints``) may name head
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
RESHAPES = {"view", "reshape", "flatten", "unflatten", "contiguous"}  # same values, other shape
REPEATS = {"repeat_interleave", "repeat", "expand"}  # a kv head served to a group of q heads
MATMULS = {"matmul", "bmm", "baddbmm", "einsum", "__matmul__"}
ROTATES = {"neg", "__neg__", "negative", "view_as_complex", "polar"}  # rotate_half, complex RoPE
FUSED = {"scaled_dot_product_attention": "sdpa", "flex_attention": "flex"}  # func -> kind


@dataclass
class Attention:
    """One block's attention: where q, k, v, the scores, the pattern and z live."""

    kind: str  # "sdpa", "flex" (fused calls: scores and pattern recomputed from them), "eager"
    op: str  # the fused call's op; for eager, the softmax op
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
    from_call: set[str] = field(default_factory=set)  # roles read from the fused call's args
    refused: dict[str, str] = field(default_factory=dict)  # hook -> why it is not here
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
    shapes: dict[str, list[int]] = field(default_factory=dict)  # flattened ops -> stream layout
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
    # op label -> (address, shape) of a module called once whose output is that op's alone: a
    # light capture keeps it from the module's frame, with no per-op mode
    outputs: dict[str, tuple[str, list]] = field(default_factory=dict)


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
    for name, module in trace.modules.items():
        calls = module.calls
        if name and len(calls) == 1 and len(calls[0].output_ops) == 1 and \
                calls[0].positions == [0]:
            label = calls[0].output_ops[0]
            structure.outputs.setdefault(label, (name, graph.ops[label].shape))
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
    width, rows = out_shape[-1], _numel(out_shape)

    def streamlike(op: Any) -> bool:  # the stream's values, maybe flattened (OPT's MLP)
        return bool(op.shape) and op.shape[-1] == width and _numel(op.shape) == rows

    # follow the stream: residual adds (an add of the stream's size reading the stream, or
    # the output of a norm that read it, as post-LN models add), aliases of the stream
    stream, normed, adds = {stream_in}, set(), []
    stages = [stream]  # the stream's aliases between residual adds (the same sets, grown)
    for op in ops:
        if len(op.parents) == 1 and op.parents[0] in stream and (
                op.func in SAME or op.func in RESHAPES and streamlike(op)):
            stream.add(op.label)  # ``x.to(float32)`` of a float32 x is x itself
        elif op.func in ADDS and len(op.parents) == 2 and streamlike(op) and not (
                stream | normed).isdisjoint(op.parents):
            adds.append((op, stream | normed, stream.isdisjoint(op.parents)))
            stream, normed = {op.label}, set()
            stages.append(stream)
        elif _is_norm(types.get(op.module, "")) and not stream.isdisjoint(op.parents):
            normed.add(_module_output(op.module, ops) or op.label)
    norms = []
    for op in ops:
        if _is_norm(types.get(op.module, "")) and op.module != address and \
                op.module in _outputs_of(op):
            norms.append(op.label)
            block.norms[op.label] = op.module
    # ``residual + attn + mlp`` (Cohere) adds twice, but the MLP never read the first sum
    parallel = len(adds) == 1 or len(adds) == 2 and not _reads(
        _other(*adds[1][:2]), stages[1], inside, graph)
    if len(adds) == 2 and not parallel:
        block.resid_mid, block.resid_post = adds[0][0].label, adds[1][0].label
        block.attn_out, block.mlp_out = _other(*adds[0][:2]), _other(*adds[1][:2])
    elif parallel:
        block.resid_post = adds[-1][0].label
        block.missing["hook_resid_mid"] = (
            "attention and MLP read the same stream in parallel, so there is no stream between "
            "them")
    else:
        block.missing["hook_resid_mid"] = block.missing["hook_resid_post"] = (
            f"found {len(adds)} residual adds in {address}, not 1 or 2")
    if adds and adds[-1][0].shape != out_shape:  # flattened: the block returns it reshaped
        if graph.source(out_label) == adds[-1][0].label:
            block.resid_post = out_label
    for said in hints.get("parallel_residual", ()):
        if bool(said) == parallel:
            continue
        raise InputError(
            f"a plugin's hint says parallel_residual={said}, but in the graph of {address} the "
            f"MLP {'does not read' if parallel else 'reads'} the stream after the attention's "
            "add", code="transformer_hint_disagrees",
            teach=["tl.trace(model, x, save=None)[" + repr(address) + "]  # read the block"])
    _norms(block, norms, stages, adds, ops, parallel)
    block.attention = _attention(ops, address, graph, types, model, hints)
    if block.attention is None:
        block.missing["attn"] = ("no attention op (scaled_dot_product_attention, flex_attention"
                                 f" or softmax) in {address}")
    else:
        attn_module = _child_of(address, graph.ops[block.attention.op].module)
        if parallel and len(adds) == 2:  # the two branches: the one the attention made first
            branches = [_other(*add[:2]) for add in adds]
            made = [_reads(b, {block.attention.z}, inside, graph) for b in branches]
            if made.count(True) == 1:
                block.attn_out = branches[made.index(True)]
                block.mlp_out = branches[made.index(False)]
        if block.attn_out is None and attn_module:
            block.attn_out = _module_output(attn_module, ops)
        mlp = _mlp(ops, address, block.attention, attn_module, types, graph, model)
        if isinstance(mlp, str):
            for hook in ("mlp.hook_pre", "mlp.hook_post"):
                block.missing[hook] = mlp
        elif mlp is not None:
            block.mlp_pre, block.mlp_post, mlp_address = mlp
            if block.mlp_out is None and mlp_address:
                block.mlp_out = _module_output(mlp_address, ops)
    for hook, label in (("hook_attn_out", block.attn_out), ("hook_mlp_out", block.mlp_out),
                        ("mlp.hook_pre", block.mlp_pre), ("mlp.hook_post", block.mlp_post)):
        if label is None:
            block.missing.setdefault(hook, f"not found in the graph of {address}")
        elif _outputs(graph.ops[label]) > 1:
            setattr(block, {"hook_attn_out": "attn_out", "hook_mlp_out": "mlp_out",
                            "mlp.hook_pre": "mlp_pre", "mlp.hook_post": "mlp_post"}[hook], None)
            block.missing[hook] = (
                f"it is one of the {_outputs(graph.ops[label])} outputs of a "
                f"{graph.ops[label].func} (a fused projection split in pieces), and the graph "
                "does not say which")
    for label in (block.resid_mid, block.resid_post, block.attn_out, block.mlp_out,
                  block.mlp_pre, block.mlp_post, block.ln1, block.ln2):
        shape = graph.ops[label].shape if label else None
        if shape and len(shape) != len(out_shape) and _numel(shape[:-1]) == _numel(out_shape[:-1]):
            block.shapes[label] = [*out_shape[:-1], shape[-1]]
    return block


def _numel(shape: list[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def _outputs(op: Any) -> int:
    """How many tensors an op returned (``chunk``, ``split``: several)."""
    return max(1, len(op.out_shapes or ()))


def _norm_inputs(label: str, module: str, ops: list) -> set[str]:
    """The ops a norm module's call read from outside it."""
    own = [op for op in ops if _inside(op.module, module)]
    labels = {op.label for op in own}
    return {p for op in own for p in op.parents if p not in labels}


def _reads(label: str, targets: set[str], inside: set[str], graph: _Graph) -> bool:
    """Whether ``label`` derives from one of ``targets`` through ops inside the block."""
    todo, seen = [label], set()
    while todo:
        current = todo.pop()
        if current in targets:
            return True
        if current in seen or current not in inside:
            continue
        seen.add(current)
        todo.extend(graph.ops[current].parents)
    return False


def _norms(block: Block, norms: list[str], stages: list[set[str]], adds: list, ops: list,
           parallel: bool) -> None:
    """ln1 and ln2 (TransformerLens's): the norms that read the residual stream. Pre-LN: the
    ones reading the block's input and the stream after the first add (a parallel block's MLP
    norm reads the input too; one norm for both is ln1 alone, as in TransformerLens); post-LN
    (a residual add reads a norm's output): the ones reading the two adds. Norms of q and k,
    or of a branch's output (Gemma 2's sandwich, OLMo 2), read no stream and are neither."""
    reads = {label: _norm_inputs(label, block.norms[label], ops) for label in norms}

    def reader(stage: set[str], but: str | None = None) -> str | None:
        return next((n for n in norms if not reads[n].isdisjoint(stage)
                     and block.norms[n] != (block.norms[but] if but else None)), None)

    post_ln = not parallel and len(adds) == 2 and adds[1][2]  # the 2nd add reads a norm
    if post_ln:
        block.ln1, block.ln2 = reader(stages[1]), reader(stages[2])
    elif len(adds) == 2 and not parallel:
        block.ln1, block.ln2 = reader(stages[0]), reader(stages[1])
    else:
        block.ln1 = reader(stages[0])  # a parallel block: both branches read the input
        if block.ln1 is not None:
            block.ln2 = reader(stages[0], but=block.ln1)
            if block.ln2 is None:
                block.missing["ln2.hook_normalized"] = (
                    f"one norm ({block.norms[block.ln1]}) serves both the attention and the "
                    "MLP of the parallel block: it is ln1")
    seen = sorted({block.norms[n] for n in norms})
    for hook, label in (("ln1.hook_normalized", block.ln1), ("ln2.hook_normalized", block.ln2)):
        if label is None:
            block.missing.setdefault(hook, (
                f"no norm of {block.address} reads the residual stream "
                f"{'after its adds' if post_ln else 'before the branch'} (its norms: "
                f"{', '.join(seen) or 'none'}; a norm of a branch's output is not ln1/ln2)"))


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
    fused = next((op for op in ops if op.func in FUSED), None)
    if fused is not None:
        kind = FUSED[fused.func]
        if _operands(fused, graph):
            q, k, v = fused.parents[:3]
            att = Attention(kind, fused.label, q, k, v, fused.label)
        else:  # k and v pieces of one split op (GPT-BigCode) make one parent: which parent is
            att = Attention(kind, fused.label, None, None, None, fused.label,  # which, the
                            from_call={"q", "k", "v"})  # call's arguments say
    else:
        att = _eager(ops, graph)
        if att is None:
            return None
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
    for role in ("q", "k", "v"):  # one piece of a split (``qkv.chunk(3)``): which, the graph
        label = getattr(att, role)  # does not say; the fused call's arguments do
        if label is not None and _outputs(graph.ops[label]) > 1:
            setattr(att, role, None)
            if att.kind != "eager":
                att.from_call.add(role)
    for role in ("k", "v"):  # under GQA, before the kv heads were repeated for the attention
        label = getattr(att, role)
        if label is not None:
            setattr(att, role, _unrepeat(label, att.n_heads, att.d_head, graph))
    known = True  # whether the graph tells the kv heads
    if att.k_proj is not None:
        att.n_kv_heads = graph.ops[att.k_proj].shape[-1] // att.d_head
    elif att.k is not None:
        att.n_kv_heads = graph.ops[att.k].shape[1]
    else:
        att.n_kv_heads, known = att.n_heads, "k" not in att.from_call
    stop, inside = {o for _, o in before}, {op.label for op in ops}
    if att.q is not None:  # rotated: rotate_half's negation between the projections and q
        att.rotary = _rotated(att.q, stop, inside, graph)
    elif "q" in att.from_call:
        att.rotary = any(_rotated(p, stop, inside, graph) for p in graph.ops[att.op].parents)
    caps = [c for c in hints.get("attn_logit_softcapping", ()) if c]
    if caps and att.kind == "sdpa":
        why = (f"the config caps attention logits (softcapping {caps[0]}: tanh before the "
               "softmax), which a scaled_dot_product_attention call cannot express; this run's "
               "attention left it out, so no pattern recomputed from the call is the "
               "architecture's (run the model with attn_implementation='eager' for them)")
        att.refused["attn.hook_attn_scores"] = att.refused["attn.hook_pattern"] = why
    for key, want in (("n_heads", att.n_heads), ("n_kv_heads", att.n_kv_heads),
                      ("d_head", att.d_head)):
        if key == "n_kv_heads" and not known:
            continue
        for said in hints.get(key, ()):
            if int(said) == want:
                continue
            raise InputError(
                f"a plugin's hint says {key}={said}, but the attention in {block} has {want}",
                code="transformer_hint_disagrees",
                teach=[f"tl.trace(model, x, save=None)[{att.op!r}]  # the attention op"])
    return att


def _operands(sdpa: Any, graph: _Graph) -> bool:
    """Whether a fused call's first three parents are its q, k and v: distinct tensors (a
    parent read twice is listed once) of the shapes and dtype attention takes."""
    if len(sdpa.parents) < 3:
        return False
    q, k, v = (graph.ops[p] for p in sdpa.parents[:3])
    return all(len(t.shape) == len(sdpa.shape) and t.dtype == q.dtype for t in (k, v)) and \
        q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2] and \
        v.shape[-1] == sdpa.shape[-1]


def _eager(ops: list, graph: _Graph) -> Attention | None:
    """An eager attention: a softmax whose output (through layout ops) a matmul takes with v;
    its scores are the softmax's input, q and k the operands of the matmul making them. Heads
    folded into the batch (BLOOM's ``bmm`` on ``[batch * head, pos, d_head]``) are read from
    the ``[batch, head, pos, d_head]`` views around them."""
    soft = next((op for op in ops if op.func in ("softmax", "_softmax")), None)
    if soft is None or not soft.parents:
        return None
    after = soft
    while len(after.children) == 1 and graph.ops[after.children[0]].func in LAYOUT:
        after = graph.ops[after.children[0]]
    z = next((graph.ops[c] for c in after.children if graph.ops[c].func in MATMULS), None)
    if z is None:
        return None
    v = next((p for p in z.parents if p != after.label), None)
    z4 = _heads_after(z, graph)
    # scores and pattern as [batch, head, q, k] (XGLM softmaxes [batch * head, q, k])
    pattern = _heads_after(soft, graph)
    scores = _heads_before(soft.parents[0], soft.shape[-1], graph, fold=soft.shape)
    if z4 is None or pattern is None or scores is None:
        return None
    d_head, seq_k = graph.ops[z4].shape[-1], graph.ops[scores].shape[-1]
    qk = _latest_matmul(scores, graph, {op.label for op in ops})
    q = k = None
    if qk is not None:
        q_label, kt_label = qk.parents[-2:] if qk.func == "baddbmm" else (qk.parents + [None])[:2]
        kt = graph.ops[kt_label] if kt_label else None
        q = _heads_before(q_label, d_head, graph) if q_label else None
        # k enters transposed (``q @ k.transpose(-1, -2)``): k is the transpose's input
        if kt is not None and kt.func in ("transpose", "mT") and len(kt.parents) == 1:
            k = _heads_before(kt.parents[0], d_head, graph)
    v = _heads_before(v, d_head, graph) if v else None
    att = Attention("eager", pattern, q, k, v, z4, scores=scores)
    if k is not None and graph.ops[k].shape[2] != seq_k:
        att.k = None
    return att


def _latest_matmul(label: str, graph: _Graph, inside: set[str]) -> Any:
    """The last matmul among an op's ancestors inside the block (what made the scores)."""
    todo, seen, found = [label], set(), None
    while todo:
        current = todo.pop()
        if current in seen or current not in inside:
            continue
        seen.add(current)
        op = graph.ops[current]
        if op.func in MATMULS and current != label:
            if found is None or graph.order[current] > graph.order[found.label]:
                found = op
            continue
        todo.extend(op.parents)
    return found


def _heads_after(z: Any, graph: _Graph) -> str | None:
    """z (or a pattern) as ``[batch, head, pos, d]``: the op itself, or the view of a
    ``[batch * head, pos, d]`` result that unfolds the heads."""
    if len(z.shape) == 4:
        return z.label
    if len(z.shape) != 3:
        return None
    op = z
    while len(op.children) == 1 and graph.ops[op.children[0]].func in LAYOUT:
        op = graph.ops[op.children[0]]
        shape = op.shape
        if len(shape) == 4 and shape[0] * shape[1] == z.shape[0] and shape[2:] == z.shape[1:]:
            return op.label
    return None


def _heads_before(label: str, d_head: int, graph: _Graph, fold: list[int] | None = None
                  ) -> str | None:
    """An attention operand as ``[batch, head, pos, d_head]``: the op itself, or the one a
    ``[batch * head, pos, d_head]`` operand (of shape ``fold``, when given) was folded from."""
    op = graph.ops[label]
    if len(op.shape) == 4 and op.shape[-1] == d_head:
        return label
    while op.func in LAYOUT and len(op.parents) == 1 and _outputs(op) == 1:
        op = graph.ops[op.parents[0]]
        shape = op.shape
        if len(shape) == 4 and shape[-1] == d_head and _outputs(op) == 1 and (
                fold is None or shape[0] * shape[1] == fold[0] and shape[2:] == fold[1:]):
            return op.label
    return None


def _unrepeat(label: str, heads: int, d_head: int, graph: _Graph) -> str:
    """k or v before their kv heads were repeated for each q head (GQA, MQA): walking back
    through layout ops and at least one repeat (``expand``, ``repeat_interleave``), the first
    ``[batch, kv_head, pos, d_head]`` op with fewer heads; the op itself otherwise."""
    op = graph.ops[label]
    if len(op.shape) != 4:
        return label
    seq, repeated = op.shape[2], False
    while (op.func in LAYOUT or op.func in REPEATS) and _outputs(op) == 1:
        repeated = repeated or op.func in REPEATS
        made = [p for p in op.parents if graph.ops[p].shape and graph.ops[p].shape != [0]]
        if len(made) != 1:
            break
        op = graph.ops[made[0]]
        shape = op.shape
        if repeated and len(shape) == 4 and shape[-1] == d_head and shape[2] == seq and \
                shape[1] < heads and heads % shape[1] == 0 and _outputs(op) == 1:
            return op.label
    return label


def _rotated(label: str, stop: set[str], inside: set[str], graph: _Graph) -> bool:
    """Whether a rotation (rotate_half's negation, a complex product) lies between the
    projections (``stop``) and ``label``, inside the block."""
    todo, seen = [label], set()
    while todo:
        current = todo.pop()
        if current in seen or current in stop or current not in inside:
            continue
        seen.add(current)
        op = graph.ops[current]
        if op.func in ROTATES:
            return True
        todo.extend(op.parents)
    return False


def _mlp(ops: list, block: str, att: Attention, attn_module: str | None, types: dict[str, str],
         graph: _Graph, model: nn.Module) -> tuple[str, str, str | None] | str | None:
    """(hook_pre op, hook_post op, the MLP's address or None): the activation's input, and the
    input of the MLP's last projection, among the projections after the attention (in one
    module, split over several (BERT's intermediate and output), or inline in the block (OPT));
    a reason when the block's MLP has no one pair of them (a mixture of experts)."""
    z_at = graph.order[att.z]
    skip = [a for a in (attn_module, att.out_proj) if a]
    region = [op for op in ops if graph.order[op.label] > z_at
              and not any(_inside(op.module, a) for a in skip)
              and not _is_norm(types.get(op.module, ""))]
    experts = sorted({op.module for op in region
                      if re.search(r"expert|moe", f"{op.module} {types.get(op.module, '')}",
                                   re.I)})
    if experts:
        return (f"the MLP is a mixture of experts ({experts[0]}): each token passes through "
                "the experts its router picks, so there is no one hidden layer of the MLP")
    linears = _linears(region, block, graph, model)
    if len(linears) < 2:
        return None
    last_address, _ = linears[-1]
    last_ops = [op for op in region if _inside(op.module, last_address)]
    own = {o.label for o in last_ops}
    post = next((p for op in last_ops for p in op.parents if p not in own), None)
    first_at = graph.order[linears[0][1]]
    act = next((op for op in region if graph.order[op.label] > first_at
                and graph.order[op.label] < graph.order[last_ops[0].label]
                and (op.func in ACTIVATIONS or _is_act(op, types))), None)
    if post is None or act is None or not act.parents:
        return None
    act_in = act.parents[0]
    # a composite activation (GPT-2's tanh GELU) starts at the activation module's input
    if _is_act(act, types):
        first = next(op for op in region if op.module == act.module)
        act_in = first.parents[0]
    children = {_child_of(block, a) for a, _ in linears}
    return act_in, post, children.pop() if len(children) == 1 else None


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
    said = _hint(hints, "embed")
    token = next((op for op in from_input if said in (None, op.module)), None)
    patches = [op.label for op in before if said in _outputs_of(op)] \
        if token is None and said is not None else []
    if token is not None:
        # the embedding module's output: Gemma's scales its lookup by sqrt(d_model)
        structure.embed = next((op.label for op in before if token.module in _outputs_of(op)),
                               token.label)
    elif patches:  # a patch embedding a plugin named (a ViT's convolution and flatten)
        structure.embed = patches[-1]
    else:
        structure.missing["hook_embed"] = "no embedding of the input ids before the first block"
    positions = [op for op in embeds if op not in from_input]
    if _hint(hints, "pos_embed"):  # named: RoBERTa derives its positions from the ids
        positions = [op for op in embeds if op.module == _hint(hints, "pos_embed")]
    param = _hint(hints, "pos_embed_param")
    if len(positions) == 1:
        structure.pos_embed = positions[0].label
    elif param and not positions:
        structure.missing["hook_pos_embed"] = (
            f"the learned positions are the parameter {param!r}, added to the stream: no op "
            f"makes them (read model.{param})")
    else:
        structure.missing["hook_pos_embed"] = (
            "the model has no learned position embedding (its positions are rotary, a bias "
            "on the scores, sinusoidal or none)"
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
