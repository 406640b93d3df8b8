"""trainport's face of ``smdistributed`` (see trainport.distributed.smddp).

Another ``smdistributed`` on the path (a real SageMaker library the job's interpreter
has) is searched first, so a real ``smdistributed.dataparallel`` is imported rather than
this one; trainport's portion is only the last resort.
"""

from __future__ import annotations

import os
import sys

_MINE = os.path.dirname(os.path.abspath(__file__))


def _other_portions() -> list[str]:
    found: list[str] = []
    for entry in sys.path:
        folder = os.path.join(os.path.abspath(entry or os.getcwd()), "smdistributed")
        if folder != _MINE and folder not in found and os.path.isdir(folder):
            found.append(folder)
    return found


__path__ = [*_other_portions(), _MINE]
