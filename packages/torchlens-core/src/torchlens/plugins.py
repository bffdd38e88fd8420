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
                    pm.load_setuptools_entrypoints(PROJECT)
                pm.check_pending()
                if os.environ.get("TORCHLENS_TRACE_HOOKS"):
                    pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
                    pm.enable_tracing()
                _manager = pm
    return _manager


def hook():
    """Shorthand for ``get_plugin_manager().hook``."""
    return get_plugin_manager().hook


def list_plugins() -> list[dict[str, str]]:
    """What is loaded: one row per plugin with its name, distribution and version."""
    pm = get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        rows.append(
            {
                "name": name,
                "module": getattr(plugin, "__name__", type(plugin).__name__),
                "distribution": dist.project_name if dist else "",
                "version": dist.version if dist else "",
            }
        )
    return rows


def core_version() -> str:
    """The installed torchlens-core version."""
    try:
        return metadata.version("torchlens-core")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"
