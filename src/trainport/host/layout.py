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
    current_host: str, hosts: list[str], instance_type: str, group: str = "homogeneousCluster"
) -> dict[str, Any]:
    ordered = sorted(hosts)
    return {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": group,
        "hosts": ordered,
        "instance_groups": [
            {"instance_group_name": group, "instance_type": instance_type, "hosts": ordered}
        ],
        "network_interface_name": "lo",
    }


def hosts_file_text(addresses: dict[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{ip}\t{host}" for host, ip in sorted(addresses.items())]
    return "\n".join(lines) + "\n"
