"""Builds a requirements environment: run *inside* the job's confinement.

``python -I envbuild.py BUILDING FINAL REQUIREMENTS SITE_DIR...`` (by path: it imports only
the standard library, so any base interpreter runs it) makes a venv
in ``BUILDING`` on the interpreter running it, lets it import the base interpreter's
packages (``SITE_DIR``s, through a ``.pth`` file), installs ``REQUIREMENTS`` with pip from
the folder that holds it, and points the venv's scripts at ``FINAL``, where the caller
renames it once this has succeeded.

A framework image's layer (``--layer-steps`` before the arguments) may also carry steps
that a requirement line cannot say, as comment lines pip itself ignores (they are part of
the lines the cache is keyed by), run in order after the requirements are installed:

- ``# trainport: for-python 3.10 REQ``: install REQ's wheel built for another Python
  (no dependencies) into the venv's site-packages, for a package the index publishes only
  for the image's Python whose compiled part does not link libpython;
- ``# trainport: compile NAME=VALUE ... REQ``: build REQ from source against the packages
  installed here (no build isolation), with those variables set.

A source's own ``requirements.txt`` never gets these: its comments stay comments.

Everything here runs code the request brings (a requirements line may name a local
package whose build runs anything), so it runs as the job does: in its sandbox, as its
unprivileged identity, with its limits and network. Only the rename happens outside.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PTH_NAME = "_trainport_base.pth"
STEP_PREFIX = "# trainport: "


def _run(
    argv: list[str], what: str, cwd: str | None = None, env: dict[str, str] | None = None
) -> None:
    print(f"{what}", flush=True)
    code = subprocess.call(argv, cwd=cwd, env=env)
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


def layer_steps(text: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """The steps in a layer's lines: (kind, variables, pip arguments) each."""
    steps: list[tuple[str, dict[str, str], list[str]]] = []
    for line in text.splitlines():
        if not line.startswith(STEP_PREFIX):
            continue
        kind, *words = line[len(STEP_PREFIX) :].split()
        if kind == "for-python" and len(words) == 2:
            python, requirement = words
            pip = ["--no-deps", "--only-binary=:all:", "--python-version", python, requirement]
            steps.append((kind, {}, pip))
        elif kind == "compile" and words:
            variables = dict(w.split("=", 1) for w in words[:-1] if "=" in w)
            # Installed here even where the base interpreter has the package (trainport's
            # own Horovod, built for PyTorch, would otherwise satisfy the requirement).
            pip = ["--no-build-isolation", "--ignore-installed", words[-1]]
            steps.append((kind, variables, pip))
        else:
            raise SystemExit(f"unknown layer step: {line}")
    return steps


def build(
    venv: Path, final: Path, requirements: Path, site_dirs: list[str], *, steps: bool = False
) -> None:
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
    for kind, variables, args in layer_steps(requirements.read_text()) if steps else ():
        if kind == "for-python":
            # pip installs a wheel of another Python's tag only into a folder it is told.
            args = [*args, "--target", purelib]
        said = " ".join([*(f"{k}={v}" for k, v in variables.items()), "pip install", *args])
        _run([*pip, *args], said, str(requirements.parent), env={**os.environ, **variables})
    retarget(venv, final)


def main() -> None:
    args = sys.argv[1:]
    steps = bool(args) and args[0] == "--layer-steps"
    venv, final, requirements, *site_dirs = args[1:] if steps else args
    build(Path(venv), Path(final), Path(requirements), site_dirs, steps=steps)


if __name__ == "__main__":
    main()
