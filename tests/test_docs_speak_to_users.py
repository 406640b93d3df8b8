"""The project's docs, code and tests speak of the project alone.

A user has the repository and nothing else: no planning documents, numbered work items or
people behind it. A sentence that says "as seed 003 does" or "see CONTRACT.md" points them
at something they cannot read; it must say what is meant in the project's own words.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["src", "docs", "examples", "benchmarks", "tests", "scripts"]
FILES = ["README.md", "Makefile", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".html", ".js", ".css", ""}

# Built from pieces, so that this file does not match itself.
INTERNAL = {
    "a numbered seed document": re.compile(r"\bseed[ _-]?0\d\d\b", re.IGNORECASE),
    "a numbered issue": re.compile(r"\bissue[ #]?\d+\b", re.IGNORECASE),
    "a planning file": re.compile("CONTRACT" + r"\.md"),
    "the people behind the work": re.compile(r"\bthe " + r"lead\b", re.IGNORECASE),
    "a folder outside the repository": re.compile("/work/" + "shared"),
}


# Files whose owner rewords them next; each entry goes when its file is clean.
def project_files() -> list[Path]:
    found = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in SUFFIXES:
                found.append(path)
    return found


def test_the_scan_covers_the_docs_and_the_code() -> None:
    names = {str(p.relative_to(ROOT)) for p in project_files()}
    assert {
        "README.md",
        "docs/contract.md",
        "docs/data.md",
        "src/trainport/cli/__init__.py",
    } <= names


def test_no_file_points_at_things_users_do_not_have() -> None:
    found = []
    for path in project_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # a binary file with a text-like name
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in INTERNAL.items():
                if pattern.search(line) and path != Path(__file__).resolve():
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
        if any(p.search(path.name) for p in INTERNAL.values()):
            found.append(f"{path.relative_to(ROOT)}: its name")
    assert not found, "\n".join(found)
