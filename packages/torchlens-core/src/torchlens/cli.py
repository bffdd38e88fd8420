"""The ``torchlens`` command line: summary, draw, record, show, diff and plugins.

Exit codes: 0 success, 2 bad usage, 3 a TorchLens refusal (its code and teach are printed),
4 the model target could not be loaded, 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import Any

from .errors import TargetError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_TARGET = 0, 1, 2, 3, 4


def parse_shapes(values: list[str] | None) -> Any:
    """``1,3,224,224`` -> one shape; repeated -> several positionals; ``name=1,16`` -> mapping."""
    if not values:
        return None

    def dims(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(d) for d in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--input-shape {text!r}: dimensions must be "
                                             "integers, e.g. 1,3,224,224") from None

    if any("=" in v for v in values):
        if not all("=" in v for v in values):
            raise argparse.ArgumentTypeError("--input-shape: use name=dims for every input or "
                                             "for none")
        return {k.strip(): dims(v) for k, v in (item.split("=", 1) for item in values)}
    shapes = [dims(v) for v in values]
    return shapes[0] if len(shapes) == 1 else shapes


def load_target(target: str, meta: bool = False):
    """``pkg.module:factory`` (a Module, a Module class or a callable returning one), or a
    folder or config file a plugin can load (e.g. a Hugging Face model folder with
    torchlens-hf). ``meta``: build the model on the meta device, reading no weights."""
    import torch
    from torch import nn

    from .plugins import hook

    config_file = os.path.isfile(target) and target.endswith(".json")
    if config_file and not meta:
        raise TargetError(f"{target} is a config file, which holds no weights: add --meta to "
                          "build the model from it on the meta device (shapes, parameters, FLOPs)")
    if os.path.isdir(target) or config_file:
        model = hook().torchlens_load_model(path=target, meta=meta)
        if model is None:
            raise TargetError(f"{target}: no installed plugin loads it (a Hugging Face model "
                              "folder or config.json needs: pip install torchlens-hf)")
        return model
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise TargetError(f"{target!r}: expected pkg.module:factory or a model folder")
    sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TargetError(f"cannot import {target!r}: {exc}") from exc
    finally:
        sys.path.pop(0)
    if isinstance(obj, nn.Module):
        model = obj.to("meta") if meta else obj
    else:
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = obj()
    if not isinstance(model, nn.Module):
        raise TargetError(f"{target!r} gave a {type(model).__name__}, not a torch.nn.Module")
    return model


def _input(args) -> tuple[Any, dict]:
    from .ladder import ABSENT

    shape = parse_shapes(args.input_shape)
    text = getattr(args, "text", None)
    if text is not None and shape is not None:
        raise argparse.ArgumentTypeError("--text and --input-shape are exclusive (one rung)")
    return (text if text is not None else ABSENT), {"input_shape": shape}


def _summary(args) -> int:
    import torchlens as tl

    model = load_target(args.target, meta=args.meta)
    value, kw = _input(args)
    print(tl.summary(model, value, depth=args.depth, ops=args.ops, **kw))
    return EXIT_OK


def _draw(args) -> int:
    import torchlens as tl

    model = load_target(args.target, meta=args.meta)
    value, kw = _input(args)
    drawing = tl.draw(model, value, path=args.output, collapse=_collapse(args.collapse),
                      theme=args.theme, **kw)
    if args.output is None:
        print(drawing)
    return EXIT_OK


def _record(args) -> int:
    import torch

    import torchlens as tl

    from .recording.inputs import read_inputs

    model = load_target(args.target)
    dtype = None
    if args.dtype is not None:
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise argparse.ArgumentTypeError(f"--dtype {args.dtype!r}: a torch dtype name such "
                                             "as bfloat16 or float16")
    generate = {"max_new_tokens": args.generate} if args.generate else None
    rec = tl.record(model, read_inputs(args.inputs), save=args.save, to=args.to, dtype=dtype,
                    reduce=args.reduce, batch_size=args.batch_size, overwrite=args.overwrite,
                    progress=False if args.no_progress else None, generate=generate)
    if int(os.environ.get("RANK", "0")) == 0:
        print(rec)
        for label in rec.labels:
            print(f"  {label}: {rec[label]!r}")
    return EXIT_OK


def _collapse(text: str) -> Any:
    return int(text) if text.isdigit() else text


def _show(args) -> int:
    import torchlens as tl

    from .summary import describe_provenance
    from .units import format_shape

    trace = tl.load(args.file)
    print(repr(trace))  # the one-line header; the op listing below honours --limit
    print(describe_provenance(trace.provenance))
    width = max((len(op.label) for op in trace), default=5)
    for op in trace.ops[: args.limit]:
        print(f"{op.label:<{width}}  {op.func:<24} {format_shape(op.shape):<20} "
              f"{op.module or ''}")
    if len(trace) > args.limit:
        print(f"... {len(trace) - args.limit} more (use --limit)")
    return EXIT_OK


def _diff(args) -> int:
    import torchlens as tl

    cmp = tl.compare(args.a, args.b, atol=args.atol, rtol=args.rtol)
    print(cmp)
    if args.output:
        cmp.draw(path=args.output, collapse=_collapse(args.collapse))
        print(f"wrote {args.output}")
    return EXIT_OK


def _plugins(args) -> int:
    from .plugins import core_version, list_plugins

    print(f"torchlens-core {core_version()}")
    for row in list_plugins():
        print(f"{row['name']:<10} {row['distribution']} {row['version']}  ({row['module']})")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchlens", description="See inside a PyTorch model.")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_input(p):
        p.add_argument("target", help="pkg.module:factory, or a model folder a plugin loads")
        p.add_argument("--input-shape", action="append", metavar="DIMS",
                       help="1,3,224,224; repeat for several inputs; name=1,16 for keywords")
        p.add_argument("--text", help="a real prompt for a Hugging Face model (torchlens-hf)")
        p.add_argument("--meta", action="store_true",
                       help="build the model on the meta device: structure, shapes, parameters "
                            "and FLOPs without reading or allocating weights")

    p = sub.add_parser("summary", help="print the module table of one pinned capture")
    with_input(p)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--ops", action="store_true", help="also list ops under their modules")
    p.set_defaults(run=_summary)
    p = sub.add_parser("draw", help="draw the graph (collapse=auto)")
    with_input(p)
    p.add_argument("-o", "--output", help="file to write (format from the suffix)")
    p.add_argument("--collapse", default="auto", help="auto, none, modules or a depth")
    p.add_argument("--theme", default="light", choices=["light", "dark", "print"])
    p.set_defaults(run=_draw)
    p = sub.add_parser("record", help="record selected activations over many inputs to a store "
                       "(runs under torchrun too)")
    p.add_argument("target", help="pkg.module:factory, or a model folder a plugin loads")
    p.add_argument("--inputs", required=True,
                   help="a text file of prompts (one a line), or a folder of images")
    p.add_argument("--save", action="append", required=True, metavar="LABEL",
                   help="an op label or module address; repeat for several")
    p.add_argument("--to", required=True, help="the store folder to write (or resume)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per forward")
    p.add_argument("--dtype", help="store values cast, e.g. bfloat16")
    p.add_argument("--reduce", choices=["mean", "last"], help="keep one row per example")
    p.add_argument("--overwrite", action="store_true", help="start the store afresh")
    p.add_argument("--generate", type=int, metavar="N",
                   help="generate N new tokens per prompt and record a row per token "
                        "(a Hugging Face generation model, torchlens-hf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_record)
    p = sub.add_parser("show", help="describe a saved trace file")
    p.add_argument("file")
    p.add_argument("--limit", type=int, default=40)
    p.set_defaults(run=_show)
    p = sub.add_parser("diff", help="compare two saved trace files op by op")
    p.add_argument("a", help="the reference trace file")
    p.add_argument("b", help="the trace file compared with it")
    p.add_argument("-o", "--output", help="also draw the diff (diff.html: the viewer in diff "
                   "mode; .svg/.pdf/.png: static)")
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (1e-5)")
    p.add_argument("--rtol", type=float, default=1.3e-6, help="relative tolerance (1.3e-6)")
    p.add_argument("--collapse", default="none", help="none, auto, modules or a depth")
    p.set_defaults(run=_diff)
    p = sub.add_parser("plugins", help="list installed plugins")
    p.set_defaults(run=_plugins)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import TorchLensError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except argparse.ArgumentTypeError as exc:
        parser.print_usage(sys.stderr)
        print(f"torchlens: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TargetError as exc:
        print(f"torchlens: cannot load the model: {exc}", file=sys.stderr)
        return EXIT_TARGET
    except TorchLensError as exc:
        print(f"torchlens: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # the model's own failure: say what, not a bare traceback
        print(f"torchlens: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
