"""The layer map holds: no import circle, no import runs up a layer, parsing a request
knows no runner, and admission asks its parts in one fixed order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import request
from trainport import tags
from trainport.errors import ValidationError
from trainport.jobs.admission import CHECKS
from trainport.spec import parse_request

ROOT = Path(__file__).resolve().parent.parent


def test_no_circle_no_import_up_a_layer_and_create_climbs_none() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layers.py")],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert "circles: 0\n" in out
    assert "up-imports: 0 " in out
    assert out.rstrip().endswith("0 climbs")


def test_parsing_a_request_imports_nothing_of_the_host_or_the_runners() -> None:
    # A fresh interpreter: this one has imported everything the other tests needed.
    code = (
        "import json, sys\n"
        "from trainport.spec import parse_request\n"
        "parse_request(json.loads(sys.argv[1]))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        "('trainport.host', 'trainport.runners', 'trainport.placement')))))\n"
    )
    argv = [sys.executable, "-c", code, json.dumps(request("pure-1"))]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_a_tags_value_is_refused_by_the_parser_its_owner_registers() -> None:
    assert tags.KNOWN["trainport:gpus-per-host"].owner == "trainport.host.gpus"
    bad = request("tag-1", Tags=[{"Key": "trainport:gpus-per-host", "Value": "many"}])
    with pytest.raises(ValidationError, match="trainport:gpus-per-host='many'"):
        parse_request(bad)


def test_a_parser_for_an_unlisted_tag_cannot_be_registered() -> None:
    with pytest.raises(KeyError, match="trainport:nope"):
        tags.parser("trainport:nope")


def test_admission_asks_its_parts_in_one_fixed_order() -> None:
    assert [name for name, _ in CHECKS] == [
        "command",
        "network",
        "channels",
        "checkpoint",
        "script",
    ]
