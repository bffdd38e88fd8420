"""torchlens 2.36.1's episode capture of a generation, run by ``steps.py`` in the ``bench-peer``
env (2.36.1 imports as ``torchlens`` too, so it cannot share a process with this repository's).

The same run as ``steps.py``: GPT-2 (``GPT2Config()``, random weights, eval, one thread, a KV
cache), a 16-token prompt, 32 new tokens, greedy. Times, in one process, the plain
``lm.generate`` (``--plain-runs`` times, median) and 2.36.1's
``torchlens.trace(lm.generate, ids, episode=EpisodeSpec(n_steps=32))`` (the 32 calls of the
model: a prefill and 31 decoding steps) once, with its default selection (every activation
saved; 2.36.1's ``save=`` takes no metadata-only spelling for an episode: ``"none"`` and
``[]`` refuse): 2.36.1's own
documentation puts 20 steps at 79 s, so one sample of each is what a benchmark can afford.
Prints one line of JSON.

    python benchmarks/peer_steps.py [--new-tokens 32] [--plain-runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from steps import setup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--plain-runs", type=int, default=3)
    args = parser.parse_args()
    import torchlens as peer

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    model, ids, options = setup(args.new_tokens)

    def plain():
        with torch.no_grad():
            return model.generate(ids, **options)

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return (time.perf_counter() - start) * 1e3, out

    plain()
    plain_ms = [timed(plain)[0] for _ in range(args.plain_runs)]
    spec = peer.options.EpisodeSpec(n_steps=args.new_tokens)
    result = {"torchlens": peer.__version__, "new_tokens": args.new_tokens,
              "plain_ms": statistics.median(plain_ms), "plain_samples_ms": plain_ms}
    # 2.36.1 leaves torch wrapped after a trace: the plain figure is taken before it
    try:
        ms, log = timed(lambda: peer.trace(model.generate, ids, episode=spec,
                                           input_kwargs=dict(options)))
        result["episode"] = {"ms": ms, "ops": len(log.layer_list)}
    except Exception as err:  # reported, not hidden: the figure is then missing
        result["episode"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
