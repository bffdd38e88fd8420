"""Every TorchLens plugin hook, in one file. Plugins implement them with ``@torchlens.hookimpl``.

Hooks are called with keyword arguments only, so an implementation may accept fewer arguments than
its spec; ``firstresult`` hooks treat ``None`` as "not mine".
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("torchlens")
hookimpl = pluggy.HookimplMarker("torchlens")


@hookspec(firstresult=True)
def torchlens_resolve_input(model, value, surface, options):
    """Turn a non-tensor real input (a string, an image, a modality dict) into a ResolvedInput."""


@hookspec(firstresult=True)
def torchlens_describe_input(value):
    """JSON-safe provenance facts for one real input value (e.g. an image's size, mode, hash)."""


@hookspec(firstresult=True)
def torchlens_image_preprocess(model):
    """The image preprocessing (a transform or an HF image processor) for ``model``, or None."""


@hookspec
def torchlens_input_recipe(model, slot):
    """Static dtype/value facts (an InputSpec) for one forward entry named ``slot``, or None."""


@hookspec
def torchlens_shape_candidates(model):
    """Rung-3 candidates from static facts: a list of input_shape values, most likely first."""


@hookspec
def torchlens_refusal_teach(model):
    """Better next steps to show first when shape inference refuses (a list of strings)."""


@hookspec(firstresult=True)
def torchlens_load_model(path, meta):
    """Load a model from a local folder or config file for the command line (e.g. a Hugging Face
    model folder); with ``meta`` build it from its config on the meta device, reading no weights."""


@hookspec
def torchlens_tied_parameters(model):
    """Parameters the model declares to be one tensor, as ``{alias name: source name}`` (e.g. a
    language model's output embedding tied to its input embedding), or None. Used where tensor
    identity cannot tell: weights offloaded by accelerate are separate placeholders per module."""


@hookspec
def torchlens_transformer_hints(model):
    """What a plugin knows of a transformer's anatomy, as a dict (None: not mine): ``n_heads``,
    ``n_kv_heads``, ``d_head``, ``parallel_residual``, ``rotary``, and the addresses ``embed``
    (an embedding, or a module embedding patches), ``pos_embed``, ``unembed``, and
    ``pos_embed_param`` (learned positions kept as a parameter, added to the stream). A hint:
    the op graph decides, and a disagreement refuses."""


@hookspec
def torchlens_renderers():
    """Rendering backends: a mapping of renderer name to a renderer class."""


@hookspec(firstresult=True)
def torchlens_generate():
    """The function behind ``tl.generate``: ``fn(model, prompt, /, **options) -> StepRun``, a
    model's own generation loop run as one step capture (torchlens-hf: a Hugging Face model's
    ``generate``), or None."""


@hookspec(firstresult=True)
def torchlens_decode_output(trace, k):
    """Output semantics for a gold trace: a DecodedOutput, or None when this plugin has none."""
