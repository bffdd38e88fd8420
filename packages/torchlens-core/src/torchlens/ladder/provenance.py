"""The provenance record: a versioned, JSON-safe account of where a trace's input came from."""

from __future__ import annotations

from typing import Any

from .real import describe_value
from .synth import GENERATOR, SEED

PROVENANCE_VERSION = 1


def gold(surface: str, args: tuple, kwargs: dict, resolver: dict | None) -> dict[str, Any]:
    slots = [{"slot": str(i), "keyword": False, **describe_value(a)} for i, a in enumerate(args)]
    slots += [{"slot": k, "keyword": True, **describe_value(v)} for k, v in kwargs.items()]
    return _record("gold", surface, "caller", slots, None, [], resolver)


def synthesized(origin: str, surface: str, slots, recipes, diary: list[dict],
                strategy: str, budget: dict | None = None) -> dict[str, Any]:
    rows = [{"slot": s.name, "keyword": s.keyword, "kind": "tensor", **r.describe()}
            for s, r in zip(slots, recipes)]
    record = _record(origin, surface, strategy, rows, {"seed": SEED, "generator": GENERATOR},
                     diary, None)
    record["probe_budget"] = budget  # rung 3: the bounds every probe was checked against
    return record


def _record(origin, surface, strategy, slots, rng, diary, resolver) -> dict[str, Any]:
    return {
        "schema": "torchlens.provenance",
        "version": PROVENANCE_VERSION,
        "origin": origin,
        "surface": surface,
        "strategy": strategy,
        "slots": slots,
        "seed": rng["seed"] if rng else None,
        "generator": rng["generator"] if rng else None,
        "probe_diary": diary,
        "resolver": resolver,
        "recapture": None,
        "probe_budget": None,
    }
