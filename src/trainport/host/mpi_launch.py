"""mpirun's launch agent: ``python -m trainport.host.mpi_launch HOST COMMAND...``.

mpirun calls its remote-shell agent once per host with the daemon's command line, as it
would call ssh. This runs inside the leader host's confinement: for the leader itself it
runs the command here; for another host it sends the command to the supervisor's launch
board (:class:`trainport.host.mpi.LaunchBoard`) and waits, connected, until that host's
daemon ends, then exits with its code. If mpirun kills this agent, the closed connection
tells the board to end the daemon. Standard library only: it starts once per host.
"""

from __future__ import annotations

import json
import os
import socket
import sys

ENV_SOCKET = "TRAINPORT_MPI_LAUNCH"
ENV_TOKEN = "TRAINPORT_MPI_TOKEN"
ENV_HOST = "TRAINPORT_MPI_HOST"
# This host's folder for shared-memory segments, handed to OpenMPI as its MCA variable only
# here: mpirun forwards every OMPI_MCA_* of its own environment to all hosts' ranks.
ENV_SHM = "TRAINPORT_MPI_SHM"
VADER_DIR = "OMPI_MCA_btl_vader_backing_directory"


def _fail(message: str) -> int:
    print(f"trainport mpi launch: {message}", file=sys.stderr, flush=True)
    return 255


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        return _fail("usage: mpi_launch HOST COMMAND...")
    host, command = argv[0], " ".join(argv[1:])
    if host == os.environ.get(ENV_HOST):
        if os.environ.get(ENV_SHM):
            os.environ[VADER_DIR] = os.environ[ENV_SHM]
        os.execvp("sh", ["sh", "-c", command])
    path, token = os.environ.get(ENV_SOCKET), os.environ.get(ENV_TOKEN)
    if not path or not token:
        return _fail(f"{ENV_SOCKET} and {ENV_TOKEN} must be set (trainport sets both)")
    # A socket address holds at most 107 bytes: connect by a name relative to its folder.
    folder, name = os.path.split(path)
    os.chdir(folder or ".")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(name)
    except OSError as exc:
        return _fail(f"cannot reach the launch board at {path}: {exc}")
    request = {"token": token, "host": host, "command": command}
    conn.sendall(json.dumps(request).encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return _fail(f"the launch board closed the connection for {host}")
        reply += chunk
    answer = json.loads(reply)
    if "error" in answer:
        return _fail(f"launch on {host} refused: {answer['error']}")
    return int(answer["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
