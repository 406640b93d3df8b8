"""The process runner: no isolation, the job's tree stays where it is on disk.

Code written for SageMaker finds it through ``SAGEMAKER_BASE_DIR`` and the ``SM_*``
variables; code that hard-codes ``/opt/ml`` needs the sandbox runner.
"""

from __future__ import annotations

from pathlib import Path

from trainport.runners.api import HostProcess, Placement, Runner

__all__ = ["ProcessRunner"]


class ProcessRunner(Runner):
    name = "process"

    def base_dir(self, placement_root: Path) -> str:
        return str(placement_root)

    def start(self, placement: Placement) -> HostProcess:
        popen = self._popen(list(placement.argv), placement)
        return HostProcess(popen, popen.pid)
