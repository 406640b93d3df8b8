"""Builds a requirements environment: run *inside* the job's confinement.

``python -I envbuild.py BUILDING FINAL REQUIREMENTS SITE_DIR...`` (by path: it imports only
the standard library, so any base interpreter runs it) makes a venv
in ``BUILDING`` on the interpreter running it, lets it import the base interpreter's
packages (``SITE_DIR``s, through a ``.pth`` file), installs ``REQUIREMENTS`` with pip from
the folder that holds it, and points the venv's scripts at ``FINAL``, where the caller
renames it once this has succeeded.

Everything here runs code the request brings (a requirements line may name a local
package whose build runs anything), so it runs as the job does: in its sandbox, as its
unprivileged identity, with its limits and network. Only the rename happens outside.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PTH_NAME = "_trainport_base.pth"


def _run(argv: list[str], what: str, cwd: str | None = None) -> None:
    print(f"{what}", flush=True)
    code = subprocess.call(argv, cwd=cwd)
    if code != 0:
        print(f"{what} failed with exit code {code}", flush=True)
        sys.exit(code)


def retarget(venv: Path, final: Path) -> None:
    """Point scripts in ``bin/`` (shebangs, activate) at the folder the venv is renamed to."""
    old, new = str(venv).encode(), str(final).encode()
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


def build(venv: Path, final: Path, requirements: Path, site_dirs: list[str]) -> None:
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "python -m venv")
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir (not a bare path line) so the base's own .pth files, editable installs
    # included, are processed too; it appends, so the venv's packages come first.
    lines = [f"import site; site.addsitedir({d!r})" for d in site_dirs]
    Path(purelib, PTH_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0:
        _run([python, "-m", "ensurepip", "--default-pip"], "python -m ensurepip")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    what = "pip install -r requirements.txt"
    _run([*pip, "-r", requirements.name], what, str(requirements.parent))
    retarget(venv, final)


def main() -> None:
    venv, final, requirements, *site_dirs = sys.argv[1:]
    build(Path(venv), Path(final), Path(requirements), site_dirs)


if __name__ == "__main__":
    main()
