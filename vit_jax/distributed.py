"""Multi-process runs: start through ``jax.distributed``, and stop every process when one is lost.

``start`` joins the processes named by the environment (``JAX_COORDINATOR_ADDRESS`` with
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, or a SLURM / Open MPI job of more than one task, which
``jax.distributed.initialize`` detects itself) and returns a ``Cluster``; one process gets ``None``.

By default JAX's processes share fate: when one dies, the coordination service (in process 0)
notices its missing heartbeats after ``heartbeat_timeout`` seconds and aborts every other process
with a C++ stack dump, while a collective that lost its peer has already raised a Python error in
the survivors. ``start`` turns that off (``jax_enable_recoverability``: the service then reports a
lost process instead of aborting the others) and runs a watchdog thread instead: every second it
asks the service which processes are alive (``get_live_nodes``, a barrier over the live processes
that returns once the service has declared the silent ones dead). When one is missing without having
said goodbye, each survivor prints one line (``Cluster.describe``) and exits with ``EXIT_LOST``, the
other survivors first and process 0, which hosts the service, last. A survivor stuck in a collective
that never returns (GPU collectives wait for a lost peer) is stopped the same way.

The runtime cannot be kept from aborting when process 0 itself is lost: the service dies with it,
and JAX ends the other processes at once with its own message and stack dump.

Start-up failures are one line each instead of JAX's abort (a C++ stack dump). The runtime does not
tell Python which processes are missing: in jax 0.10 the connect's ``RegisterTask`` call waits until every
process has registered, a key-value call made from another thread before it returns aborts the process
("wrong service incarnation"), and at the deadline its error is ``DEADLINE_EXCEEDED`` naming no process
(only the service's register barrier names them, in the text of an abort, when a timeout that
``jax.distributed.initialize`` does not expose expires first). So once the coordinator, the process count
and this process's id are known (from the environment, or as JAX detects a SLURM or Open MPI job:
``detected_job``), ``roll_call`` runs before JAX's start: process 0
listens on the coordinator's address itself (a port in use is named with its address), every other
process connects there and says its id and count (one JSON line), and process 0 answers each once all
have come, then closes the port for JAX's service. Processes that have not come by ``init_timeout``,
two with one id, or another JAX_NUM_PROCESSES are one line in every process that came, naming the ids;
a process 0 that never answers is one line in the others. A process whose ``jax.distributed.initialize``
has not returned after ``init_timeout`` seconds after that (or at all, where no job could be detected)
says so and exits with ``EXIT_START``, before JAX's own deadline (``init_timeout`` + ``_JAX_GRACE``)
aborts it.

Before any work, ``Cluster.agree`` has every process publish its run's fields (what decides the
result: the run config, the model flags, the absolute run folder) and their sha256 through the
coordination service; every process compares all the others' hashes with its own, and a difference
stops each process with one line naming the fields that differ and each process's value.

``get_live_nodes`` and the distributed client are internal JAX API (the one
``jax.experimental.multihost_utils.live_devices`` builds on); they are the same in jax 0.10 and 0.11.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping

import jax
from jax._src import distributed as _jax_distributed

EXIT_LOST = 75  # sysexits.h EX_TEMPFAIL: the run stopped through no fault of its own; start it again
POLL_SECONDS = 1.0  # how often the watchdog asks the service which processes are alive
EXIT_START = 2  # a start-up failure (a port in use, processes that never joined): bad input to the run
_LEFT = "vit/left/"  # key-value store: process id -> how it left ("done" or the error that stopped it)
_RUN = "vit/run/"  # key-value store: process id -> {"sha256": ..., "fields": {name: value}} of its run
_JAX_GRACE = 30  # seconds JAX's own start-up deadline lies after ours (its expiry is an abort)


def cluster_env(env=os.environ) -> dict | None:
    """``jax.distributed.initialize`` arguments the environment asks for, or None for one process.

    Raises:
        ValueError: JAX_NUM_PROCESSES or JAX_PROCESS_ID is not an int, JAX_NUM_PROCESSES is below 1, or
            one of the two is given without the other (JAX's cluster detection fills both or neither).
    """
    if env.get("JAX_COORDINATOR_ADDRESS"):
        out = {}
        for name, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
            if env.get(name):
                try:
                    out[key] = int(env[name])
                except ValueError:
                    raise ValueError(f"{name}={env[name]!r}: expected an int") from None
        if len(out) == 1:
            names = ["JAX_NUM_PROCESSES", "JAX_PROCESS_ID"]
            given, missing = names if "num_processes" in out else names[::-1]
            raise ValueError(f"{given} is set but {missing} is not: set both (and JAX_COORDINATOR_ADDRESS)")
        if out.get("num_processes", 1) < 1:
            raise ValueError(f"JAX_NUM_PROCESSES={out['num_processes']}: expected an int >= 1")
        return out if out.get("num_processes", 2) > 1 else None
    if int(env.get("SLURM_NTASKS", "1")) > 1 or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return {}
    return None


def start(
    *,
    heartbeat_timeout: int,
    init_timeout: int,
    shutdown_timeout: int,
    describe: Callable[[list[int], dict[int, str]], str],
) -> Cluster | None:
    """Join the other processes of the run (must come before any other JAX call); None for one process.

    Args:
        heartbeat_timeout: seconds without a heartbeat after which a process counts as lost.
        init_timeout: seconds to wait for every process to join.
        shutdown_timeout: seconds process 0 waits at the end for the others to leave.
        describe: (lost process ids, {process id: error} of processes that stopped with an error) ->
            the one line a survivor prints before it exits.
    """
    kwargs = cluster_env()
    if kwargs is None:
        return None
    address, n, pid = detected_job(kwargs, init_timeout)
    if address and n is not None and pid is not None:
        roll_call(address, n, pid, init_timeout)
    jax.config.update("jax_enable_recoverability", True)
    joined = threading.Event()
    timer = threading.Thread(
        target=_start_deadline, args=(joined, init_timeout, address, kwargs), name="vit-start", daemon=True
    )
    timer.start()
    jax.distributed.initialize(
        **kwargs,
        initialization_timeout=init_timeout + _JAX_GRACE,
        heartbeat_timeout_seconds=heartbeat_timeout,
        shutdown_timeout_seconds=shutdown_timeout,
    )
    joined.set()
    cluster = Cluster(_jax_distributed.global_state.client, heartbeat_timeout, shutdown_timeout, describe)
    cluster.watch()
    return cluster


def detected_job(kwargs: dict, timeout: int) -> tuple[str | None, int | None, int | None]:
    """(coordinator address, process count, this process's id) of the job: the environment's
    (``cluster_env``'s ``kwargs`` and JAX_COORDINATOR_ADDRESS), the rest as ``jax.distributed.initialize``
    detects it (SLURM, Open MPI, ...: JAX's ``ClusterEnv.auto_detect_unset_distributed_params``, internal
    API, as jax 0.10 has it; a version where it differs or fails counts as no detection); None for what
    neither gives (the roll call is then skipped and JAX's start-up alone names what is missing)."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    n, pid = kwargs.get("num_processes"), kwargs.get("process_id")
    if address and n is not None and pid is not None:
        return address, n, pid
    try:
        from jax._src.clusters import ClusterEnv

        address, n, pid, _ = ClusterEnv.auto_detect_unset_distributed_params(address, n, pid, None, None, timeout)
    except Exception:  # detection is JAX's to report, when initialize runs it again
        return None, None, None
    return address, n, pid


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"JAX_COORDINATOR_ADDRESS={address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _listen(address: str) -> socket.socket:
    try:
        return socket.create_server(_host_port(address), family=_family(address.rpartition(":")[0]))
    except OSError as e:
        raise ValueError(
            f"JAX_COORDINATOR_ADDRESS={address}: process 0 cannot listen there ({e.strerror or e}); "
            "choose a free port on process 0's host"
        ) from None


_HELLO = "vit-roll-call"  # the first key of a roll-call line: anything else connecting is not a process of ours
_LINE_BYTES = 4096  # a roll-call line is at most this long (a reply naming thousands of ids included)
_ACK_SECONDS = 15  # process 0 acknowledges a check-in within this (it gives a stranger 5 s to say hello)


def roll_call(address: str, num_processes: int, process_id: int, timeout: int) -> None:
    """Have every process of the job check in with process 0 at ``address`` before JAX starts (see the
    module docstring); returns in each process once all ``num_processes`` have, with distinct ids.

    Process 0 listens on ``address``; each other process connects (retrying until ``timeout`` seconds
    have passed) and sends ``{"vit-roll-call": 1, "process_id": i, "num_processes": n}`` as a JSON line;
    process 0 acknowledges it at once with ``{"waiting": seconds}`` (the time left until its own deadline)
    and answers ``{"ok": true}`` or ``{"error": LINE}`` by then. Connections that do not send such a line
    within 5 seconds are dropped (not a process of this job); a process that gets no acknowledgement
    within ``_ACK_SECONDS`` is not talking to process 0 of its job.

    Raises:
        ValueError: one line, prefixed with this process's id and the count: process 0 cannot listen on
            ``address`` (a port in use); processes that had not come within ``timeout`` seconds (their
            ids), two processes with one id, or one with another count (in every process that came);
            process 0 did not answer (in the others).
    """
    me = f"process {process_id} of {num_processes}"
    if not 0 <= process_id < num_processes:
        raise ValueError(f"JAX_PROCESS_ID={process_id}: expected 0 to {num_processes - 1} (JAX_NUM_PROCESSES)")
    if process_id == 0:
        error = _gather(_listen(address), address, num_processes, timeout)
    else:
        error = _check_in(address, num_processes, process_id, timeout)
    if error:
        raise ValueError(f"{me}: {error}; start all processes with the same environment")


def _gather(server: socket.socket, address: str, n: int, timeout: int) -> str | None:
    """Process 0's side of ``roll_call``: the error line, or None once every process has come."""
    deadline = time.monotonic() + timeout
    came: dict[int, socket.socket] = {}
    problems: list[str] = []
    others: list[socket.socket] = []  # a process with a clashing id or count: told too, then closed
    server.settimeout(POLL_SECONDS / 5)
    try:
        while len(came) < n - 1 and not problems and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            hello = _Lines(conn).read(min(deadline, time.monotonic() + 5))
            if not isinstance(hello, dict) or hello.get(_HELLO) != 1:
                conn.close()  # a port scanner, a health check: not one of ours
                continue
            i, m = hello.get("process_id"), hello.get("num_processes")
            if m != n:
                problems.append(f"process {i} has JAX_NUM_PROCESSES={m}, process 0 has {n}")
            elif not isinstance(i, int) or not 0 < i < n or i in came:
                problems.append(f"two processes say JAX_PROCESS_ID={i}")
            if problems:
                others.append(conn)
            else:
                came[i] = conn
                _send(conn, {"waiting": deadline - time.monotonic()})  # how long it may wait for the answer
        missing = sorted(set(range(1, n)) - set(came))
        if problems:
            error = "; ".join(problems)
        elif missing:
            ids = ", ".join(map(str, missing))
            error = (
                f"process{'es' if len(missing) > 1 else ''} {ids} did not join the coordinator {address} within "
                f"--init-timeout {timeout} s (never started, or another JAX_COORDINATOR_ADDRESS)"
            )
        else:
            error = None
        for conn in [*came.values(), *others]:
            _send(conn, {"ok": True} if error is None else {"error": error})
            _closed_by_peer(conn)
        return error
    finally:
        for conn in [*came.values(), *others]:
            conn.close()
        server.close()


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # a process that left: it has said why itself


def _closed_by_peer(conn: socket.socket) -> None:
    """Wait (a second at most) for the other side to close first, so that the port's closed connections
    wait out their TIME_WAIT on that side, not on the port JAX binds next."""
    try:
        conn.settimeout(1.0)
        conn.recv(1)
    except OSError:
        pass


def _check_in(address: str, n: int, i: int, timeout: int) -> str | None:
    """A process's side of ``roll_call``: the error line, or None once process 0 says all have come."""
    deadline = time.monotonic() + timeout
    host, port = _host_port(address)
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            break
        except OSError:
            if time.monotonic() >= deadline:
                return (
                    f"process 0 did not answer at the coordinator {address} within --init-timeout {timeout} s "
                    "(not started, or listening elsewhere)"
                )
            time.sleep(POLL_SECONDS / 5)
    with conn:
        _send(conn, {_HELLO: 1, "process_id": i, "num_processes": n})
        lines = _Lines(conn)
        # process 0 acknowledges at once (busy with another caller for 5 s at most) with the seconds left
        # until its own deadline, by which it answers
        reply = lines.read(time.monotonic() + _ACK_SECONDS)
        if isinstance(reply, dict) and isinstance(reply.get("waiting"), (int, float)):
            reply = lines.read(time.monotonic() + min(reply["waiting"], 86400) + 5)  # (process 0's timeout)
    if isinstance(reply, dict) and reply.get("ok") is True:
        return None
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        return reply["error"]
    return (
        f"the coordinator {address} did not answer as process 0 of this job does: another program listens there, "
        "or the job's processes had all come already (a process too many, whose id another has?)"
    )


class _Lines:
    """The JSON lines a socket sends, each by a deadline and at most ``_LINE_BYTES`` long."""

    def __init__(self, conn: socket.socket):
        self.conn, self.data = conn, b""

    def read(self, deadline: float) -> object:
        """The next line's JSON value, or None (closed, too long, not JSON, not by ``deadline``)."""
        while b"\n" not in self.data:
            left = deadline - time.monotonic()
            if left <= 0 or len(self.data) > _LINE_BYTES:
                return None
            self.conn.settimeout(left)
            try:
                chunk = self.conn.recv(_LINE_BYTES + 1)
            except OSError:
                return None
            if not chunk:
                return None
            self.data += chunk
        line, self.data = self.data.split(b"\n", 1)
        try:
            return json.loads(line) if len(line) <= _LINE_BYTES else None
        except (ValueError, RecursionError):
            return None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _start_deadline(joined: threading.Event, seconds: int, address: str | None, kwargs: dict) -> None:
    """If the processes have not all joined within ``seconds``, say so in one line and exit."""
    if joined.wait(seconds):
        return
    n, me = kwargs.get("num_processes", "?"), kwargs.get("process_id", "?")
    where = f"the coordinator {address}" if address else "the job's coordinator"
    print(
        f"vit train: error: process {me} of {n}: not every process joined {where} within --init-timeout "
        f"{seconds} s (a process that never started, another JAX_NUM_PROCESSES, or nobody listening there); "
        "start all processes with the same environment",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_START)


def run_digest(fields: Mapping[str, object]) -> tuple[str, str]:
    """(canonical JSON text of ``fields``, its sha256 in hex): what ``Cluster.agree`` compares."""
    text = json.dumps(dict(fields), sort_keys=True, default=str)
    return text, hashlib.sha256(text.encode()).hexdigest()


def disagreement(runs: Mapping[int, Mapping[str, object]]) -> str | None:
    """One line naming each field on which the processes' runs ({process id: fields}) differ, with each
    process's value, or None when they agree."""
    names = sorted(set().union(*runs.values()))
    parts = []
    for name in names:
        values = {k: runs[k].get(name, "(not given)") for k in sorted(runs)}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            parts.append(f"{name} ({', '.join(f'process {k}: {v}' for k, v in values.items())})")
    if not parts:
        return None
    return "the processes of this run disagree on " + "; ".join(parts) + "; start every process with the same flags"


class Cluster:
    """The processes of a running multi-process job, watched for loss (see the module docstring).

    Each process says how it left in the coordination service's key-value store: "done", "stopped"
    (after another process was lost) or "error: ..." (the error that stopped it). A process missing
    from the live set that said nothing is lost; one that left with an error stops the others too.
    """

    def __init__(self, client, heartbeat_timeout: int, shutdown_timeout: int, describe):
        self.client, self.describe = client, describe
        self.index, self.count = jax.process_index(), jax.process_count()
        self.heartbeat_timeout, self.shutdown_timeout = heartbeat_timeout, shutdown_timeout
        self._leaving = threading.Event()  # this process is leaving: the watchdog reports nothing more
        self._failing = threading.Event()  # this process is stopping with its own error
        self._wake = threading.Event()
        self._rounds = threading.Condition()
        self._started = self._done = 0
        self._thread = threading.Thread(target=self._watch, name="vit-watchdog", daemon=True)

    def watch(self) -> None:
        self._thread.start()

    def agree(self, fields: Mapping[str, object], timeout: int) -> None:
        """Publish this process's run ``fields`` ({flag: value}, JSON-serialisable) and compare their hash
        with every other process's (waiting at most ``timeout`` s for each), before any work.

        Raises:
            ValueError: the processes' fields differ (``disagreement``: the fields, each process's value).
        """
        text, digest = run_digest(fields)
        self.client.key_value_set(f"{_RUN}{self.index}", json.dumps({"sha256": digest, "fields": json.loads(text)}))
        runs = {
            k: json.loads(self.client.blocking_key_value_get(f"{_RUN}{k}", timeout * 1000)) for k in range(self.count)
        }
        if all(r["sha256"] == digest for r in runs.values()):
            return
        raise ValueError(disagreement({k: r["fields"] for k, r in runs.items()}))

    def _live(self) -> set[int]:
        return set(self.client.get_live_nodes(list(range(self.count))))

    def _statuses(self) -> dict[int, str]:
        return {int(k.rsplit("/", 1)[1]): v for k, v in self.client.key_value_dir_get(_LEFT)}

    def _watch(self) -> None:
        while not self._leaving.is_set():
            with self._rounds:
                self._started += 1
                this = self._started
            try:
                live = self._live()
                said = self._statuses()
            except Exception:  # the client is shutting down under us, or process 0 and its service are
                return  # gone, and JAX's runtime ends this process itself
            if self._leaving.is_set():
                return
            lost = sorted(set(range(self.count)) - live - set(said))
            failed = {k: v for k, v in said.items() if v.startswith("error") and k != self.index}
            if lost or (failed and not self._failing.is_set()):
                self._stop(self.describe(lost, failed))
            with self._rounds:
                self._done = this
                self._rounds.notify_all()
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()

    def _stop(self, line: str) -> None:
        """Print ``line``, leave the job in order (process 0, the service's host, last) and exit.

        Python logging is silenced first: leaving cancels the barriers that other threads (orbax's
        background checkpoint commit) wait at, and their error reports would only repeat the line.
        """
        print(line, file=sys.stderr, flush=True)
        sys.stdout.flush()
        logging.disable(logging.CRITICAL)
        self._leave_in_order("stopped", wait=self.heartbeat_timeout + 2 * POLL_SECONDS)
        os._exit(EXIT_LOST)

    def check(self, error: BaseException) -> None:
        """Call before ``error`` ends this process: gives the watchdog one fresh round to find a lost
        process (it then ends this process with its line), so that a collective that failed because a
        peer died is reported as that, not as the collective's error."""
        self._failing.set()
        if isinstance(error, KeyboardInterrupt):
            return
        with self._rounds:
            target = self._started + 1
            self._wake.set()
            self._rounds.wait_for(
                lambda: self._done >= target or not self._thread.is_alive(),
                self.heartbeat_timeout + 5 * POLL_SECONDS,
            )

    def leave(self, error: BaseException | None = None) -> None:
        """Leave the job, done or stopped by ``error`` (which the other processes then report and stop on).

        Process 0 hosts the coordination service, so it waits (at most ``shutdown_timeout`` s) until
        every other process has left before it shuts the service down.
        """
        how = "done" if error is None else f"error: {type(error).__name__}: {error}".splitlines()[0]
        self._leave_in_order(how, wait=self.shutdown_timeout)

    def _leave_in_order(self, how: str, wait: float) -> None:
        self._leaving.set()
        self._wake.set()
        try:
            self.client.key_value_set(f"{_LEFT}{self.index}", how, allow_overwrite=True)
        except Exception:  # the service is gone; nobody is left to tell
            pass
        if self.index == 0:
            _bounded(self._others_gone, wait)
        if threading.current_thread() is not self._thread:
            self._thread.join(self.heartbeat_timeout + 2 * POLL_SECONDS)
        _bounded(jax.distributed.shutdown, wait)

    def _others_gone(self) -> None:
        while self._live() - {0}:  # returns when every live process has called it too, or has left
            time.sleep(0.1)


def _bounded(fn: Callable[[], None], seconds: float) -> None:
    """Run ``fn`` in a daemon thread and wait at most ``seconds`` for it (errors ignored)."""

    def run():
        try:
            fn()
        except Exception:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
