"""scripts/fetch-dashboard-vendor.sh: uPlot from the npm registry at its pinned version and
checksum, with its licence; a tarball whose checksum differs is refused and nothing is
installed."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.conftest import require

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fetch-dashboard-vendor.sh"


def _registry_reachable() -> bool:
    try:
        socket.create_connection(("registry.npmjs.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


def test_the_pinned_tarball_is_installed_and_another_refused(tmp_path: Path) -> None:
    require(_registry_reachable(), "registry.npmjs.org is not reachable from here")
    refused = subprocess.run(
        [str(SCRIPT), "--dest", str(tmp_path / "bad"), "--sha256", "0" * 64],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert f"not the pinned {'0' * 64}; refusing it" in refused.stderr
    assert not (tmp_path / "bad").exists()

    fetched = subprocess.run([str(SCRIPT), "--dest", str(tmp_path / "good")], capture_output=True)
    assert fetched.returncode == 0, fetched.stderr
    files = sorted(p.name for p in (tmp_path / "good").iterdir() if not p.name.startswith("."))
    assert files == ["uPlot.LICENSE", "uPlot.iife.min.js", "uPlot.min.css"]
    assert "MIT" in (tmp_path / "good" / "uPlot.LICENSE").read_text()
    again = subprocess.run([str(SCRIPT), "--dest", str(tmp_path / "good")], capture_output=True)
    assert again.returncode == 0 and b"fetching" not in again.stderr  # already there


def test_an_unknown_option_is_named() -> None:
    wrong = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True)
    assert wrong.returncode == 2
    assert "unknown option --version (use --dest DIR or --sha256 HEX)" in wrong.stderr
