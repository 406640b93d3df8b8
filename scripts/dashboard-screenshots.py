"""Regenerate the dashboard screenshots in docs/img/ from a real server and real jobs.

Starts a server on a throw-away TRAINPORT_HOME (process runner), runs a few small jobs
through boto3 (two that differ in their learning rate, a two-host job whose algo-2 fails,
one stopped), and photographs in headless Chromium: the list, a job's page, the failed
two-host job's page (algo-2's log shown first) and the comparison of the two runs.

    .venv/bin/python scripts/dashboard-screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from trainport.config import load_settings
from trainport.server.app import ServerConfig, build_server

log = logging.getLogger("dashboard-screenshots")

KEY_ID, SECRET = "TPAKSCREENSHOTS00001", "screenshots-secret"
# Each under 256 characters (a ContainerEntrypoint item's limit).
TRAIN = (
    "import json,os,time\n"
    "b=os.environ.get('SAGEMAKER_BASE_DIR','/opt/ml')\n"
    "r=float(json.load(open(b+'/input/config/hyperparameters.json'))['lr'])*9\n"
    "for e in range(9):print('epoch %d loss=%.4f accuracy=%.3f'%(e,2/(1+r*e),1-.5/(1+r*e)),"
    "flush=True);time.sleep(.6)\n"
)
TWO_HOSTS = (
    "import os,json,time\n"
    "h=json.load(open(os.environ.get('SAGEMAKER_BASE_DIR','/opt/ml')"
    "+'/input/config/resourceconfig.json'))['current_host']\n"
    "print('host',h,flush=True);x=[0]*9**7;time.sleep(3 if h=='algo-2' else 60)\n"
    "print('shard 7 is corrupt on',h);exit(3)\n"
)
SLOW = "import time\nprint('warming up',flush=True)\ntime.sleep(60)\n"


def request(name: str, code: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-demo",
        "AlgorithmSpecification": {
            "TrainingImage": "trainport/python",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-c", code],
            "MetricDefinitions": [
                {"Name": "loss", "Regex": r"loss=([0-9.]+)"},
                {"Name": "accuracy", "Regex": r"accuracy=([0-9.]+)"},
            ],
        },
        "HyperParameters": {"epochs": "9", "lr": "0.1", "batch_size": "64"},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://demo-data/train/",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://demo-out/models"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Environment": {"WANDB_API_KEY": "hidden-from-the-dashboard"},
        "Tags": [{"Key": "project", "Value": "resnet-demo"}],
    }
    body.update(overrides)
    return body


def wait(
    sm: Any, name: str, statuses: tuple[str, ...] = ("Completed", "Failed", "Stopped")
) -> None:
    deadline = time.monotonic() + 180
    while sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] not in statuses:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {name} did not end within 180 s")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/img"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainport-shots-") as tmp:
        home = Path(tmp) / "home"
        data = home / "store" / "demo-data" / "train"
        data.mkdir(parents=True)
        (data / "part-0.csv").write_text("1,2\n3,4\n")
        env = {
            **os.environ,
            "TRAINPORT_HOME": str(home),
            "TRAINPORT_SERVER_KEYS": f"{KEY_ID}:{SECRET}",
            "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER": "1",
            "TRAINPORT_STOP_GRACE_SECONDS": "2",
        }
        os.environ.update(env)  # the jobs' supervisors read the same settings
        server = build_server(ServerConfig(port=0, max_concurrent_jobs=4), load_settings(env))
        server.start_background()
        try:
            sm = boto3.client(
                "sagemaker",
                endpoint_url=server.url,
                region_name="us-east-1",
                aws_access_key_id=KEY_ID,
                aws_secret_access_key=SECRET,
                config=Config(retries={"max_attempts": 1}),
            )
            log.info("running the jobs")
            sm.create_training_job(**request("resnet-lr-010", TRAIN))
            sm.create_training_job(
                **request(
                    "resnet-lr-003",
                    TRAIN,
                    HyperParameters={"epochs": "9", "lr": "0.03", "batch_size": "64"},
                )
            )
            two = request(
                "resnet-2-hosts",
                TWO_HOSTS,
                ResourceConfig={
                    "InstanceType": "ml.m5.large",
                    "InstanceCount": 2,
                    "VolumeSizeInGB": 1,
                },
            )
            sm.create_training_job(**two)
            sm.create_training_job(**request("resnet-warmup-stopped", SLOW))
            wait(sm, "resnet-warmup-stopped", ("InProgress",))
            time.sleep(1)
            sm.stop_training_job(TrainingJobName="resnet-warmup-stopped")
            for name in (
                "resnet-lr-010",
                "resnet-lr-003",
                "resnet-2-hosts",
                "resnet-warmup-stopped",
            ):
                wait(sm, name)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
                )
                try:
                    page = browser.new_page(viewport={"width": 1200, "height": 760})
                    page.set_default_timeout(60_000)
                    page.goto(server.dashboard_url())
                    page.wait_for_selector('tr[data-job="resnet-lr-010"]')
                    page.check('tr[data-job="resnet-lr-010"] input.select')
                    page.check('tr[data-job="resnet-lr-003"] input.select')
                    page.screenshot(path=str(args.out / "dashboard-list.png"))
                    page.click("#compare")
                    page.wait_for_selector('#compare-charts .chart[data-chart="loss"] canvas')
                    page.check("#by-step")
                    page.wait_for_timeout(300)
                    page.screenshot(path=str(args.out / "dashboard-compare.png"), full_page=True)
                    page.goto(server.url + "/#/jobs/resnet-lr-010")
                    page.wait_for_selector('#resources .chart[data-chart="cpu"] canvas')
                    page.wait_for_function(
                        "document.getElementById('log').textContent.includes('epoch 8')"
                    )
                    page.screenshot(path=str(args.out / "dashboard-job.png"), full_page=True)
                    page.goto(server.url + "/#/jobs/resnet-2-hosts")
                    page.wait_for_selector('#resources .chart[data-chart="memory"] canvas')
                    page.wait_for_function(
                        "document.getElementById('log').textContent.includes('corrupt')"
                    )
                    page.screenshot(
                        path=str(args.out / "dashboard-multihost-failed.png"), full_page=True
                    )
                finally:
                    browser.close()
        finally:
            server.close()
    for name in ("list", "compare", "job", "multihost-failed"):
        log.info("wrote %s", args.out / f"dashboard-{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
