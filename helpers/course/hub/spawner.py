"""batchspawner's port callback, narrowed to the port (imported by the hub only).

In a learner's job, ``batchspawner-singleuser`` picks a free port and reports it by
POSTing ``{"port": N}`` to ``/hub/api/batchspawner`` with the server's API token.
batchspawner 1.3.0's handler sets *every* spawner attribute named in that body. The
token sits in the learner's environment, so a learner could send
``{"exec_prefix": "", "batch_cancel_cmd": "..."}`` and have the hub, which runs as
root, run a command of theirs when the server stops. The handler here accepts the
port and nothing else (400 otherwise); ``install()`` puts it in batchspawner's place.
"""

from __future__ import annotations

import json

from batchspawner.api import BatchSpawnerAPIHandler
from jupyterhub.apihandlers import default_handlers
from tornado import web

ROUTE = r"/api/batchspawner"


class PortOnlyHandler(BatchSpawnerAPIHandler):
    @web.authenticated
    def post(self):
        token = self.get_auth_token()
        spawners = self.current_user.spawners.values()
        spawner = next((s for s in spawners if s.api_token == token), None)
        data = self.get_json_body() or {}
        port = data.get("port")
        if spawner is None or set(data) != {"port"} or not isinstance(port, int):
            raise web.HTTPError(400, "the server may report {'port': N} and nothing else")
        if not 0 < port < 65536:
            raise web.HTTPError(400, f"port {port} is out of range")
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": "port recorded"}))


def install() -> None:
    """Replace batchspawner's handler in JupyterHub's API routes (before the hub starts)."""
    for i, (route, _) in enumerate(default_handlers):
        if route == ROUTE:
            default_handlers[i] = (ROUTE, PortOnlyHandler)
            return
    raise RuntimeError(f"batchspawner's {ROUTE} handler is not registered: import batchspawner")
