"""torchlens-hf: Hugging Face models in TorchLens; a prompt string is a real input.

Registered through the ``torchlens`` entry point (``torchlens_hf.plugin``); importing it does not
import transformers.
"""

__version__ = "0.1.0"
