"""Rows counted in CPU instructions under Valgrind's callgrind: the work a call adds, free of
the host's noise (a forward here moves by about 6% from one call to the next; a count by
well under 1%). Instructions are not time (memory stalls are not counted), so a count
completes a timed row rather than replacing it. Needs ``valgrind`` on the PATH.

The parent runs a script again under ``valgrind --tool=callgrind --instr-atstart=no``; inside,
``count_rows`` turns counting on (``callgrind_control -i on``) only around each row's counted
calls, after one warm call, and dumps the row's total.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def count_rows(rows: dict[str, Callable[[], Any]], calls: int, out: Path) -> None:
    """Inside valgrind: count each row's ``calls`` calls (one dump a row); names to ``out``."""
    pid = str(os.getpid())

    def control(*command: str) -> None:
        subprocess.run(["callgrind_control", *command, pid], check=True, capture_output=True)

    names = list(out.read_text().splitlines()) if out.exists() else []
    for row, fn in rows.items():
        fn()  # warm: first-call costs (imports, caches) are not the row's
        control("-z")
        control("-i", "on")
        for _ in range(calls):
            fn()
        control("-i", "off")
        control(f"--dump=row{len(names)}")
        names.append(row)
        out.write_text("\n".join(names))


def counted(script: str, args: list[str], tmp: Path, tag: str, calls: int,
            env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``python script *args --child-out FILE`` under callgrind (its ``count_rows`` names
    the rows in FILE); instructions per call of each row."""
    names = tmp / f"{tag}.rows"
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={tmp}/cg.{tag}.%p", sys.executable, script, *args,
                    "--child-out", str(names)], check=True, env=env or dict(os.environ),
                   capture_output=True)
    totals = {}
    for path in tmp.glob(f"cg.{tag}.*.*"):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump row(\d+)", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            totals[int(trigger.group(1))] = int(total.group(1)) / calls
    return {row: totals[i] for i, row in enumerate(names.read_text().splitlines())}

