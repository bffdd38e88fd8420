"""The plugin host: one pluggy manager, entry points of group ``torchlens`` loaded lazily, once."""

from __future__ import annotations

import os
import sys
import threading
from importlib import metadata

import pluggy

from . import hookspecs

PROJECT = "torchlens"
_lock = threading.Lock()
_manager: pluggy.PluginManager | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager: specs added, entry points loaded on first use, impls checked."""
    global _manager
    if _manager is None:
        with _lock:
            if _manager is None:
                pm = pluggy.PluginManager(PROJECT)
                pm.add_hookspecs(hookspecs)
                if not os.environ.get("TORCHLENS_DISABLE_PLUGINS"):
                    _load_entry_points(pm)
                pm.check_pending()
                if os.environ.get("TORCHLENS_TRACE_HOOKS"):
                    pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
                    pm.enable_tracing()
                _manager = pm
    return _manager


_dists: dict[str, tuple[str, str]] = {}


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register every ``torchlens`` entry point; a plugin that fails to import is skipped with a
    warning instead of breaking the core."""
    from .errors import warn

    for ep in metadata.entry_points(group=PROJECT):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:
            warn("plugin_load_failed", f"the torchlens plugin {ep.name!r} ({ep.value}) failed to "
                 f"load and is skipped: {type(exc).__name__}: {exc}", stacklevel=4)
            continue
        dist = ep.dist
        _dists[ep.name] = (dist.metadata["Name"], dist.version) if dist else ("", "")


def hook():
    """Shorthand for ``get_plugin_manager().hook``."""
    return get_plugin_manager().hook


def list_plugins() -> list[dict[str, str]]:
    """What is loaded: one row per plugin with its name, module, distribution and version."""
    pm = get_plugin_manager()
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist, version = _dists.get(name, ("", ""))
        rows.append({"name": name,
                     "module": getattr(plugin, "__name__", type(plugin).__name__),
                     "distribution": dist, "version": version})
    return rows


def core_version() -> str:
    """The installed torchlens-core version."""
    try:
        return metadata.version("torchlens-core")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"
