"""``python -m trainport.cli``: the ``trainport`` command."""

from __future__ import annotations

from trainport.cli import main

main()
