"""Loaded by the broker processes of tests/system/test_gc_premise.py only (their
PYTHONPATH starts with this folder): keeps what the cyclic collector frees
(``gc.DEBUG_SAVEALL``) and, each time the test drops a file named ``collect`` in
``$MINOU_GC_PROBE``, collects and writes ``report.json``: the large strings and bytes
that only reference cycles held. Then it forgets them, ready for the next round."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path

LARGE = 64 * 1024


def _report() -> dict[str, object]:
    gc.collect()
    held = []
    for obj in gc.garbage:
        for ref in gc.get_referents(obj):
            if isinstance(ref, (bytes, bytearray, str, memoryview)) and len(ref) >= LARGE:
                held.append({"holder": type(obj).__qualname__, "type": type(ref).__name__,
                             "size": len(ref), "repr": repr(obj)[:200]})
    report = {"cyclic_objects": len(gc.garbage), "large": held}
    gc.garbage.clear()
    return report


def _watch(folder: Path) -> None:
    trigger = folder / "collect"
    while True:
        if trigger.exists():
            report = _report()
            (folder / "report.tmp").write_text(json.dumps(report))
            os.replace(folder / "report.tmp", folder / "report.json")
            trigger.unlink()
        time.sleep(0.05)


if os.environ.get("MINOU_GC_PROBE"):
    gc.set_debug(gc.DEBUG_SAVEALL)
    threading.Thread(target=_watch, args=(Path(os.environ["MINOU_GC_PROBE"]),),
                     daemon=True, name="gc-probe").start()
