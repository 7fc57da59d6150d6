"""A Ray actor serving the code sandbox's `run_code` API on its node (the RLJob's sandbox role).

A thin actor around `hybridflow.tools.sandbox_server`: the server listens on the node's address (the pod IP on
a cluster) at a free port, in a thread of the actor's process, and the programs run as that process's sandboxed
children. hybridflow.controller.sandbox_service starts one per sandbox pod and restarts it through Ray
(`max_restarts`); a restarted actor serves at a new address, which `url()` reports.
"""

from __future__ import annotations

from hybridflow.tools.sandbox_server import ServerSettings, serve_in_thread


class SandboxServerWorker:
    """One run_code server on this Ray node."""

    def __init__(self, max_concurrency: int, host: str | None = None) -> None:
        import ray

        # the node's address: reachable from the driver on a cluster, and the machine's own on a local Ray
        self._server, self._url = serve_in_thread(host or ray.util.get_node_ip_address(), 0,
                                                  ServerSettings(max_concurrency=max_concurrency))
        self._node_id = ray.get_runtime_context().get_node_id()

    def url(self) -> str:
        """The server's base URL (POST <url>/run_code)."""
        return self._url

    def node_id(self) -> str:
        """The Ray node the server runs on."""
        return self._node_id
