"""Recording activations over many inputs: ``tl.record``, ``tl.recording.open``, ``dry_run``.

``record`` keeps small recordings in memory and writes large ones to a sharded store on disk
(safetensors shards plus a JSON manifest) that ``open`` maps back without reading it whole.
"""

from __future__ import annotations

from .dry_run import dry_run
from .manifest import RecordingError
from .memory import Recording
from .reader import LabelView, RecordingDataset, StoredRecording, TokenView, open
from .record import record

__all__ = ["LabelView", "Recording", "RecordingDataset", "RecordingError", "StoredRecording",
           "TokenView", "dry_run", "open", "record"]
