"""The Ray cluster of a ``--ray`` run: check its address, connect to it, or start a local one
and stop every process of it. Used by :class:`squad.cluster.ray.RayFanout`.

Addresses (:func:`check_address`): ``local`` (None in the API: a one-node cluster on 127.0.0.1),
``auto``, ``HOST:PORT`` (a GCS), ``ray://HOST:PORT`` (Ray Client); anything else is a
:class:`~squad.errors.UserError` (exit 2). An address where nothing accepts a TCP connection
within :data:`PROBE_TIMEOUT` seconds (:func:`probe`), or Ray's own error while connecting, is a
:class:`~squad.errors.ClusterError` (exit 1). :class:`LocalCluster` records the process tree Ray
starts and kills what is left :data:`STOP_GRACE` seconds after ``ray.shutdown()``, so no process
of it outlives the run.

Design: docs/design/ray.md
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import socket
import tempfile
from typing import Any

from squad.errors import ClusterError, UserError

__all__ = ["check_address", "probe", "connect", "LocalCluster", "ADDRESS_FORMS", "PROBE_TIMEOUT", "STOP_GRACE"]

ADDRESS_FORMS = "'local', 'auto', HOST:PORT (a cluster's GCS, e.g. 10.0.0.5:6379) or ray://HOST:PORT (Ray Client)"
PROBE_TIMEOUT = 3.0
"""Seconds a cluster's HOST:PORT gets to accept a TCP connection before ``ray.init``."""
STOP_GRACE = 3.0
"""Seconds a local cluster's processes get to exit after ``ray.shutdown()`` before SIGKILL."""
CLIENT_HINT = "pip install 'ray[client]'"

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
_QUIET = dict(logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)


def check_address(address: str | None) -> tuple[str, str, int] | None:
    """Check ``address``'s form (module docstring); returns ``(kind, host, port)`` for
    ``HOST:PORT`` (kind ``"gcs"``) and ``ray://HOST:PORT`` (kind ``"client"``), None for a
    local cluster (None, ``"local"``) and ``"auto"``. Raises :class:`UserError`: another form,
    a port outside 1-65535, ``ray://`` without Ray Client installed."""
    if address is None or address in ("local", "auto"):
        return None
    kind, rest = ("client", address[len("ray://"):]) if address.startswith("ray://") else ("gcs", address)
    match = _HOST_PORT.match(rest)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise UserError(f"--ray {address!r} is not a Ray address: give {ADDRESS_FORMS}")
    if kind == "client" and importlib.util.find_spec("grpc") is None:  # what Ray checks for Ray Client
        raise UserError(f"--ray {address} connects through Ray Client, which is not installed: {CLIENT_HINT}")
    return kind, match["host"].strip("[]"), int(match["port"])


def probe(address: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise :class:`ClusterError` unless ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``;
    nothing to probe for the others) accepts a TCP connection within ``timeout`` seconds."""
    parsed = check_address(address)
    if parsed is None:
        return
    _, host, port = parsed
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        what = "Ray Client server" if address.startswith("ray://") else "Ray cluster (its GCS)"
        raise ClusterError(f"no {what} answers at {address} ({exc.strerror or type(exc).__name__}, "
                           f"{timeout:g} s): start the cluster (`ray start --head`) or fix --ray") from None


def connect(address: str) -> Any:
    """``ray`` connected to the existing cluster at ``address`` (blocking; :func:`probe` first).
    Raises :class:`ClusterError` with Ray's reason when it cannot connect."""
    probe(address)
    import ray

    try:
        ray.init(address=address, **_QUIET)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        raise ClusterError(f"could not connect to the Ray cluster at {address!r} ({_first_line(exc)}): start it "
                           "(`ray start --head`), fix --ray, or run on a cluster of this "
                           "machine: --ray local") from None
    return ray


class LocalCluster:
    """A one-node Ray cluster on 127.0.0.1 that this process starts and stops (module docstring).
    ``temp_dir``: Ray's logs and sockets (None: a new temp dir, which :meth:`stop` removes)."""

    def __init__(self, temp_dir: str | None, num_cpus: int) -> None:
        self.own_temp = temp_dir is None
        self.temp = temp_dir if temp_dir is not None else tempfile.mkdtemp(prefix="squad-ray-")
        self.num_cpus = num_cpus
        self.started = False
        self._seen: dict[int, Any] = {}  # pid -> psutil.Process (it knows its start time: no pid reuse)

    def start(self) -> Any:
        """Start the cluster; returns ``ray`` connected to it (blocking). Raises
        :class:`UserError` when Ray did not take 127.0.0.1, :class:`ClusterError` when it did not start."""
        # read when ray is imported: Ray takes 127.0.0.1 as the node's address and binds its servers there
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        self.started = True  # from here on, stop() has something to stop, even if init fails half-way
        try:
            ray.init(_node_ip_address="127.0.0.1", _temp_dir=self.temp, num_cpus=self.num_cpus, **_QUIET)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
            raise ClusterError(f"the local Ray cluster did not start: {_first_line(exc)} (logs: {self.temp})") from None
        finally:
            self.collect()
        node = ray.util.get_node_ip_address()
        if node != "127.0.0.1":
            raise UserError(f"the local Ray cluster took the address {node}, not 127.0.0.1 (ray was imported before "
                            "squad could set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0): set it in the environment")
        return ray

    def collect(self) -> None:
        """Record the cluster's processes alive now (module docstring); call it again as the
        cluster grows (workers, their engines): a process whose parent died is no longer found."""
        import psutil

        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for child in children:
            try:
                if self.temp not in " ".join(child.cmdline()):
                    continue
                for proc in (child, *child.children(recursive=True)):
                    self._seen.setdefault(proc.pid, proc)
            except psutil.Error:
                continue

    @property
    def pids(self) -> list[int]:
        """The pids recorded so far."""
        return sorted(self._seen)

    def stop(self, grace: float = STOP_GRACE) -> list[int]:
        """``ray.shutdown()``, then kill every recorded process still alive (SIGKILL after ``grace``
        seconds); remove a temp dir it made. Blocking; returns the pids it had
        to kill. Safe to call twice."""
        import psutil

        if not self.started:
            return []
        self.collect()
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001 - a half-started cluster: its processes are killed below
            pass
        # ray.shutdown() stopped what it knew of; the rest (the raylet's agents when the raylet died
        # first, a cluster interrupted while it started) gets ``grace`` seconds to follow, then SIGKILL
        _, left = psutil.wait_procs([p for p in self._seen.values() if _alive(p)], timeout=grace)
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=grace)
        self.started = False
        if self.own_temp:
            import shutil

            shutil.rmtree(self.temp, ignore_errors=True)
        return sorted(p.pid for p in left)


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
