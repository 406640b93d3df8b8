"""SMDDP for TensorFlow is not provided by trainport: importing it says so."""

from __future__ import annotations

from trainport.distributed.smddp.errors import unsupported

raise unsupported("smdistributed.dataparallel.tensorflow")
