"""``trainport server``: the SageMaker training API and the dashboard over HTTP."""

from __future__ import annotations

import logging
import signal
import sys

import click

from trainport.cli.common import echo_err, handle_errors

__all__ = ["server"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port (0: any free port).")
@click.option("--max-jobs", type=int, help="Concurrent jobs (TRAINPORT_MAX_CONCURRENT_JOBS).")
@click.option("--no-auth", is_flag=True, help="Accept unsigned requests (NOT for shared hosts).")
@handle_errors
def server(host: str, port: int, max_jobs: int | None, no_auth: bool) -> None:
    """Serve the SageMaker training API (boto3: endpoint_url=...) and a dashboard."""
    from trainport.server.app import ServerConfig, build_server

    logging.getLogger("trainport").setLevel(logging.INFO)
    config = ServerConfig(host=host, port=port, auth=not no_auth, max_concurrent_jobs=max_jobs)
    srv = build_server(config)
    if srv.created_key is not None:
        echo_err(
            "Created an access key for this server (shown once; kept in "
            f"{srv.service.settings.server_keys_path}):\n"
            f"  AWS_ACCESS_KEY_ID={srv.created_key.key_id}\n"
            f"  AWS_SECRET_ACCESS_KEY={srv.created_key.secret}\n"
            "(boto3 and the SageMaker SDK take it as these; the trainport CLI on another "
            "machine as TRAINPORT_ACCESS_KEY_ID and TRAINPORT_SECRET_ACCESS_KEY)"
        )
    echo_err(f"trainport server on {srv.url} (boto3: endpoint_url='{srv.url}')")
    echo_err(f"dashboard: {srv.dashboard_url()}")
    srv.scheduler.start()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        srv.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        echo_err("trainport server: shutting down (running jobs keep running)")
    finally:
        srv.server_close()
        srv.scheduler.close()
