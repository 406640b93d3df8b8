"""Telling a live supervisor from a dead one, robust to pid reuse and reboots."""

from __future__ import annotations

from pathlib import Path

__all__ = ["boot_id", "identity", "is_alive"]


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished its work
        return None
    return int(fields[19])


def identity(pid: int) -> tuple[int, int, str] | None:
    ticks = _start_ticks(pid)
    return None if ticks is None else (pid, ticks, boot_id())


def is_alive(ident: tuple[int, int, str]) -> bool:
    pid, ticks, boot = ident
    return boot == boot_id() and _start_ticks(pid) == ticks
