"""The ``trainport`` command line: run jobs, look at them, stop them, serve them.

Every command goes through the jobs service (:class:`~trainport.jobs.service.JobService`,
or a running server's through :class:`~trainport.client.RemoteJobService` with
``--endpoint``). Errors trainport raises on purpose print as one clear line (exit 2); the
exit code of ``run`` is 0 only when the job Completed.

The commands live by group: :mod:`.run` (run, demo), :mod:`.jobs` (jobs ...),
:mod:`.server` (server); what they share is in :mod:`.common` and following a job at the
terminal in :mod:`.follow`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import click

from trainport.cli.jobs import jobs
from trainport.cli.run import demo, run
from trainport.cli.server import server
from trainport.follow import follow_job, summary
from trainport.tuning.cli import tune_command, tuning_group

__all__ = ["cli", "follow_job", "main", "summary"]

# Libraries whose warnings are theirs to fix, not the user's to read (urllib3's "Connection
# pool is full", say): shown with --verbose only.
_QUIET_LIBRARIES = ("urllib3", "botocore", "boto3", "s3transfer", "filelock", "fsspec")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what trainport does.")
@click.option(
    "--endpoint",
    metavar="URL",
    help="Send run/jobs commands to a running `trainport server` (or TRAINPORT_ENDPOINT).",
)
@click.option(
    "--aws-credentials",
    is_flag=True,
    help="With --endpoint: sign with your AWS credentials (variables, AWS_PROFILE, files) "
    "instead of the server's key or TRAINPORT_ACCESS_KEY_ID/TRAINPORT_SECRET_ACCESS_KEY.",
)
@click.version_option(package_name="trainport")
def cli(verbose: bool, endpoint: str | None, aws_credentials: bool) -> None:
    """Run SageMaker-style training jobs on this machine."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        for name in _QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module=r"(urllib3|botocore|boto3)(\.|$)")


class _LazySelect(click.Command):
    """``trainport select``, imported only when used: model selection pulls in torch and
    its backends, which every other command would otherwise pay for at start-up."""

    def _real(self) -> click.Command:
        from trainport.select.cli import select_command

        return select_command

    def get_help(self, ctx: click.Context) -> str:
        return self._real().get_help(ctx)

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> click.Context:
        return self._real().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        return self._real().invoke(ctx)


cli.add_command(run)
cli.add_command(jobs)
cli.add_command(demo)
cli.add_command(_LazySelect("select", help="Model selection with model hopper parallelism."))
cli.add_command(tune_command)
cli.add_command(tuning_group)
cli.add_command(server)


def main() -> None:
    cli(prog_name="trainport")
