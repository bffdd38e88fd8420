"""Capture through ``torch.compile``: the selected values (and edits) become part of the compiled
graph, placed by one eager capture of the same input signature.

``locate`` finds where each selected op runs in the forward's stream of torch calls; ``Compiler``
compiles the forward for one surface call (and puts the graphs away after); ``CompiledTaps``
is the light capture's part that runs the compiled forward with the taps in its graph.
"""

from .compiler import Compiler, compile_options
from .locate import Located, locate
from .run import CompiledRun
from .taps import CompiledTaps
from .trace import compiled_trace, refuse_compiled_trace

__all__ = ["CompiledRun", "CompiledTaps", "Compiler", "Located", "compile_options",
           "compiled_trace", "locate", "refuse_compiled_trace"]
