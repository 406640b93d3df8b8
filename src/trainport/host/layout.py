"""The ``/opt/ml`` tree of one host, on disk, and its three config files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HostLayout", "hosts_file_text", "resource_config"]

OPT_ML = "/opt/ml"


@dataclass(frozen=True)
class HostLayout:
    """Paths inside one host's tree; ``root`` is what the job sees as ``/opt/ml``."""

    root: Path

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.root / "output" / "data"

    @property
    def failure_file(self) -> Path:
        return self.root / "output" / "failure"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    def local(self, opt_ml_path: str) -> Path:
        """The on-disk place of a path the job names under ``/opt/ml``."""
        rel = Path(opt_ml_path).relative_to(OPT_ML)
        return self.root / rel

    def create(self) -> None:
        for d in (
            self.config_dir,
            self.data_dir,
            self.model_dir,
            self.output_data_dir,
            self.code_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)

    def write_configs(
        self,
        hyperparameters: dict[str, str],
        input_data_config: dict[str, dict[str, str]],
        resource: dict[str, Any],
    ) -> None:
        files = {
            "hyperparameters.json": hyperparameters,
            "inputdataconfig.json": input_data_config,
            "resourceconfig.json": resource,
        }
        for name, doc in files.items():
            (self.config_dir / name).write_text(json.dumps(doc, indent=2, sort_keys=False))


def resource_config(
    current_host: str,
    groups: list[tuple[str, str, list[str]]],
    network_interface: str = "lo",
) -> dict[str, Any]:
    """resourceconfig.json for ``current_host``; ``groups`` is (name, instance type, hosts)
    for every instance group, in order (one "homogeneousCluster" without InstanceGroups)."""
    hosts = sorted((h for _, _, members in groups for h in members), key=_host_number)
    current = next(g for g in groups if current_host in g[2])
    return {
        "current_host": current_host,
        "current_instance_type": current[1],
        "current_group_name": current[0],
        "hosts": hosts,
        "instance_groups": [
            {
                "instance_group_name": name,
                "instance_type": kind,
                "hosts": sorted(members, key=_host_number),
            }
            for name, kind, members in groups
        ],
        "network_interface_name": network_interface,
    }


def _host_number(host: str) -> tuple[str, int]:
    # algo-2 before algo-10: SageMaker's hosts list is in host order, which for up to nine
    # hosts is also the lexicographic order its documentation promises.
    prefix, _, number = host.rpartition("-")
    return (prefix, int(number)) if number.isdigit() else (host, 0)


def hosts_file_text(addresses: dict[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{ip}\t{host}" for host, ip in sorted(addresses.items())]
    return "\n".join(lines) + "\n"
