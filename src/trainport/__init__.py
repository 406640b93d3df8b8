"""trainport: SageMaker-style training jobs on a laptop, your own servers, or a Ray cluster.

The public surface is small: :class:`trainport.jobs.service.JobService` (the one door every
front end goes through), the CLI in :mod:`trainport.cli`, and the training-side libraries
that import nothing of the platform.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
