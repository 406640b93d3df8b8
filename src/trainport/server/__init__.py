"""trainport's server: the SageMaker training API (JSON 1.1, SigV4) that boto3 talks to,
the CloudWatch Logs subset log tailers use, and a dashboard in the browser.

- :mod:`.protocol`: the JSON 1.1 door (size, signature, content type, target, body);
- :mod:`.sigv4`: signature verification and the server's access keys;
- :mod:`.sagemaker_api`, :mod:`.logs_api`: the operations;
- :mod:`.dashboard_api` and ``dashboard/``: the browser's endpoints and static page;
  :mod:`.dashboard_auth` signs people in, :mod:`.dashboard_series` shapes what it draws;
- :mod:`.unserved`: the answer, in their own protocol, to clients of other AWS services;
- :mod:`.asgi`: the application that routes each HTTP request to one of the above;
- :mod:`.limits`: HTTP itself (uvicorn, httptools' strict parser) and the connection limits;
- :mod:`.app`: the server that ties them to the jobs service and its scheduler.
"""

from __future__ import annotations

from trainport.server.app import ServerConfig, TrainportServer, build_server

__all__ = ["ServerConfig", "TrainportServer", "build_server"]
