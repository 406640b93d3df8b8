"""A sandbox plan as an OCI runtime configuration, for runc.

:func:`oci_config` is a pure function: the plan (what the job sees), its host's limits,
the uid it runs as on the machine and its network namespace become the ``config.json`` of
an OCI bundle. runc then brings what a runtime is trusted for: the user namespace mapping
uid 0 inside to ``uid`` outside, cgroups (v1 or v2) enforcing the limits, a seccomp filter,
masked and read-only ``/proc`` paths, a UTS namespace with the host's name.

What the plan does not say and runc must not be asked for: plan symlinks and generated
files live in the bundle's ``rootfs`` (made at the edge, :mod:`trainport.runners.sandbox`),
and ``/dev``'s standard nodes and links runc makes itself when ``/dev`` is a tmpfs.

The command runs under ``tini`` as the PID namespace's init: a training script as PID 1
would ignore SIGTERM (the kernel drops signals PID 1 has no handler for), and nothing
would reap what it leaves behind. tini also ends the container when ``runc run`` dies:
runc keeps a container running after its client is gone.
"""

from __future__ import annotations

from typing import Any

from trainport.runners.limits import Limits
from trainport.runners.plan import DEVICES, MountKind, SandboxPlan

__all__ = ["BLOCKED_SYSCALLS", "MASKED_PATHS", "READONLY_PATHS", "oci_config"]

# Kernel interfaces a job has no use for and that leak the machine's state or widen its
# attack surface; masked as container runtimes mask them.
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)
# System calls refused with EPERM: kernel keyrings, modules, clocks, swap, reboot, eBPF and
# perf, mounting and namespaces, handle-based opens. The rest of the kernel's interface is
# allowed, so training code and its libraries run as they do in a container.
BLOCKED_SYSCALLS = (
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "sysfs",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
)
_CLONE_NEWUSER = 0x10000000
QUIET = "TINI_VERBOSITY"
ENV = "/usr/bin/env"  # in every root: /usr is shown whole
_MIB = 1 << 20


def _seccomp() -> dict[str, Any]:
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [
            "SCMP_ARCH_X86_64",
            "SCMP_ARCH_X86",
            "SCMP_ARCH_X32",
            "SCMP_ARCH_AARCH64",
        ],
        "syscalls": [
            {"names": list(BLOCKED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            # No new user namespaces (clone's flag; clone3's flags lie in memory seccomp
            # cannot read, so clone3 says it does not exist and C libraries use clone).
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": 1,
                "args": [
                    {
                        "index": 0,
                        "value": _CLONE_NEWUSER,
                        "valueTwo": _CLONE_NEWUSER,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        ],
    }


def _mount(target: str, kind: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": target, "type": kind, "source": source, "options": options}


def _mounts(
    plan: SandboxPlan, files: dict[str, str], limits: Limits | None
) -> list[dict[str, Any]]:
    mounts = []
    # The in-memory folders count against the memory limit anyway; their size says so
    # up front (ENOSPC, not an out-of-memory kill, when one fills).
    size = [f"size={limits.memory_bytes // _MIB}m"] if limits else []
    for m in plan.mounts:
        if m.kind is MountKind.RO_BIND:
            mounts.append(_mount(m.target, "bind", m.source, ["rbind", "ro", "nosuid", "nodev"]))
        elif m.kind is MountKind.BIND:
            mounts.append(_mount(m.target, "bind", m.source, ["rbind", "nosuid", "nodev"]))
        elif m.kind is MountKind.DEV_BIND:
            if m.source not in DEVICES:  # runc makes the standard nodes itself
                mounts.append(_mount(m.target, "bind", m.source, ["bind", "nosuid"]))
        elif m.kind is MountKind.TMPFS:
            options = ["nosuid", "nodev", f"mode={m.source}"]
            if m.target == "/dev":
                options = ["nosuid", "strictatime", "mode=755", "size=65536k"]
            elif m.target in ("/tmp", "/dev/shm"):
                options += size
            mounts.append(_mount(m.target, "tmpfs", "tmpfs", options))
            if m.target == "/dev":
                devpts = ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
                mounts.append(_mount("/dev/pts", "devpts", "devpts", devpts))
        elif m.kind is MountKind.PROC:
            mounts.append(_mount(m.target, "proc", "proc", ["nosuid", "nodev", "noexec"]))
        elif m.kind is MountKind.FILE:
            options = ["bind", "ro", "nosuid", "nodev"]
            mounts.append(_mount(m.target, "bind", files[m.target], options))
        elif m.kind is MountKind.MASK:
            pass  # the plan masks nothing the allow-list brings in; /proc's are below
        # SYMLINK: made in the rootfs (or by runc under /dev)
    return mounts


def _resources(limits: Limits | None) -> dict[str, Any]:
    if limits is None:
        return {}
    period = 100_000
    return {
        "memory": {"limit": limits.memory_bytes},
        "cpu": {"quota": int(limits.cpus * period), "period": period},
        "pids": {"limit": limits.tasks},
    }


def oci_config(
    plan: SandboxPlan,
    *,
    uid: int,
    init: str,
    files: dict[str, str],
    cgroup: str,
    limits: Limits | None,
    netns_path: str | None,
) -> dict[str, Any]:
    """The bundle's ``config.json``. ``files`` maps each FILE mount's target to the file
    written for it in the bundle; ``init`` is tini's path."""
    namespaces: list[dict[str, str]] = [
        {"type": "user"},
        {"type": "mount"},
        {"type": "pid"},
        {"type": "ipc"},
        {"type": "uts"},
    ]
    if netns_path:
        namespaces.append({"type": "network", "path": netns_path})
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": plan.uid, "gid": plan.uid},
            # -p: the container ends with its runc (a Ray worker or a supervisor killed
            # takes its host down, as a process runner's job would go with it).
            # tini's own warnings (a signal that came after the command ended) are not the
            # job's output: it is told to be quiet, and the command does not inherit that.
            "args": [init, "-p", "SIGKILL", "-g", "--", ENV, "-u", QUIET, *plan.argv],
            "env": [f"{k}={v}" for k, v in plan.env.items() if k != QUIET] + [f"{QUIET}=0"],
            "cwd": plan.cwd,
            "noNewPrivileges": plan.no_new_privs,
            "capabilities": {
                kind: list(plan.capabilities)
                for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": plan.hostname or "localhost",
        "mounts": _mounts(plan, files, limits),
        "linux": {
            "uidMappings": [{"containerID": 0, "hostID": uid, "size": 1}],
            "gidMappings": [{"containerID": 0, "hostID": uid, "size": 1}],
            "namespaces": namespaces,
            "cgroupsPath": cgroup,
            "resources": _resources(limits),
            "seccomp": _seccomp(),
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
