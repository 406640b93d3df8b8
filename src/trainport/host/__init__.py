"""The host agent: the only code that knows ``/opt/ml``.

For one host it lays out the tree (:mod:`layout`), stages every channel (:mod:`channels`),
seeds checkpoints (:mod:`checkpoints`), works out what to run (:mod:`command`,
:mod:`script_mode`), starts and watches the training process (:mod:`agent`: logs, metrics
from :mod:`metrics`, stop and max runtime), and uploads what the job leaves
(:mod:`artifacts`). It reports events upward and decides no job-level policy.
"""
