"""Process-group set-up for ``torchrun`` (single process when launched plainly) and the collectives every tool
uses: training, sharded inference and evaluation.

A rank or node lost mid-run (killed, out of memory, its machine gone) breaks the next collective of the others:
gloo says ``Connection closed by peer [IP]:PORT``. The collectives here turn that into :class:`PeerLostError`, one
line naming the lost rank, or its node: at start every rank records where it runs (:class:`Place`: host, node,
addresses and socket ports), and the peer's address is looked up among them.
"""

from __future__ import annotations

import heapq
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass
class DistInfo:
    """Where this process stands."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Join the process group ``torchrun`` describes in the environment, else run as one process.

    Args:
        device: ``cuda`` or ``cpu``; default: CUDA when available. Under torchrun each rank takes
            ``cuda:LOCAL_RANK`` and NCCL, or gloo on CPU.
    """
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        _places[:] = all_gather_objects(Place.here())
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev)


class PeerLostError(ConnectionError):
    """A collective failed because another rank stopped or its node cannot be reached (one line, naming it)."""


_LOST_PEER = re.compile(r"closed by peer|reset by peer|broken pipe|remote process exited|connection refused", re.I)
_ADDRESS = re.compile(r"\[([^\]]+)\]:(\d+)|(\d+\.\d+\.\d+\.\d+)<(\d+)>")
"""A peer's address in a backend's error: gloo's ``[10.0.0.2]:40123``, NCCL's ``10.0.0.2<40123>``."""


@dataclass(frozen=True)
class Place:
    """Where one rank runs, recorded by every rank when the process group starts."""

    host: str
    node: int
    """torchrun's node rank (``GROUP_RANK``)."""
    addresses: frozenset[str]
    """This host's IP addresses: of its name, and the one that leads to ``MASTER_ADDR``."""
    ports: frozenset[int]
    """The local ports of this process's TCP sockets, listening or connected (Linux; empty elsewhere): those of
    the backend's connections to the other ranks among them."""

    @staticmethod
    def here() -> Place:
        return Place(socket.gethostname(), int(os.environ.get("GROUP_RANK", "0")), _addresses(), _local_ports())

    def __str__(self) -> str:
        return f"node {self.node}, host {self.host}"


_places: list[Place] = []
"""Every rank's :class:`Place`, in rank order (empty in one process)."""


def _addresses() -> frozenset[str]:
    found = set()
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # sends nothing: picks the route
            probe.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "1"))))
            found.add(probe.getsockname()[0])
    except (OSError, ValueError):
        pass
    return frozenset(found)


def _local_ports() -> frozenset[int]:
    """The local ports of this process's listening and connected TCP sockets, from ``/proc`` (empty without)."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                inodes.add(os.readlink(f"/proc/self/fd/{fd}").removeprefix("socket:[").removesuffix("]"))
            except OSError:
                continue
    except OSError:
        return frozenset()
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        # the local address (hex IP:PORT) is field 1, the state field 3 (01 connected, 0A listening), the inode 9
        ports.update(int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3] in ("01", "0A") and row[9] in inodes)
    return frozenset(ports)


def lost_peer(operation: str, backend_error: str, rank: int, world_size: int, places: Sequence[Place]) -> str:
    """The one line that says which rank (or node) a failed collective lost.

    Args:
        operation: The collective (``all_gather_objects``).
        backend_error: The backend's message (gloo: ``[pair.cc:561] Connection closed by peer [IP]:PORT. ...``).
        rank: This rank.
        world_size: The number of ranks.
        places: Every rank's :class:`Place`, in rank order (empty if unknown).
    """
    detail = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", backend_error.strip().splitlines()[0]).split(". ")[0]
    others = [r for r in range(world_size) if r != rank]
    match = _ADDRESS.search(detail)
    ip, port = (match.group(1) or match.group(3), int(match.group(2) or match.group(4))) if match else (None, None)
    known = len(places) == world_size
    by_port = [r for r in others if known and port is not None and {port, _swapped(port)} & places[r].ports]
    if len(by_port) == 1 or len(others) == 1:
        lost = by_port[0] if by_port else others[0]
        who = f"rank {lost}" + (f" ({places[lost]})" if known else "")
    else:
        nodes = {places[r].node for r in others if known and ip in places[r].addresses}
        if len(nodes) == 1:
            node = nodes.pop()
            ranks = [r for r in others if places[r].node == node]
            listed = ", ".join(map(str, ranks))
            if node == places[rank].node:
                who = f"one of rank(s) {listed} of this node ({places[rank]})"
            else:
                who = f"node {node} (host {places[ranks[0]].host}, rank(s) {listed})"
        else:
            who = "another rank" + (f" (at {ip}:{port})" if ip else "")
    return (
        f"lost {who} during {operation} ({detail}): it stopped or its node went down, and this rank stops too; "
        "its own log says why"
    )


def _swapped(port: int) -> int:
    """``port`` with its two bytes swapped: gloo prints a peer's port in network byte order."""
    return ((port & 0xFF) << 8) | (port >> 8)


@contextmanager
def collective(operation: str) -> Iterator[None]:
    """Run a collective; a rank lost meanwhile raises :class:`PeerLostError` naming it (see :func:`lost_peer`)."""
    try:
        yield
    except RuntimeError as err:  # torch.distributed.DistBackendError and gloo's errors are RuntimeErrors
        if not _LOST_PEER.search(str(err)):
            raise
        rank, world = rank_and_world()
        raise PeerLostError(lost_peer(operation, str(err), rank, world, _places)) from None


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ranks (``x`` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        x = x.clone()
        with collective("all_reduce_mean"):
            dist.all_reduce(x)
        x /= dist.get_world_size()
    return x


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` when not distributed). Every rank must call it."""
    if dist.is_available() and dist.is_initialized():
        out: list[Any] = [None] * dist.get_world_size()
        with collective("all_gather_objects"):
            dist.all_gather_object(out, obj)
        return out
    return [obj]


def from_rank0(compute: Callable[[], T]) -> T:
    """``compute()`` run on rank 0 only and its result sent to every rank, so all work on the same value (one listing
    of a folder that changes while the ranks start). An exception it raises is raised on every rank. Every rank must
    call it; in one process it is ``compute()``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (True, compute())
        except Exception as err:  # every rank raises it, none waits for a result that never comes
            box[0] = (False, err)
    with collective("from_rank0"):
        dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def raise_on_every_rank(error: str | None) -> None:
    """Raise ``ValueError`` on every rank when any rank passes an ``error`` (the first in rank order), so that no
    rank is left waiting in a collective for one that stopped. Every rank must call it (a no-op in one process
    without an error)."""
    errors = [e for e in all_gather_objects(error) if e is not None]
    if errors:
        raise ValueError(errors[0])


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        with collective("barrier"):
            dist.barrier()


def check_launcher(launcher: str | None, command: str = "tools/train.py CONFIG") -> None:
    """Refuse a ``--launcher`` (mmseg's flag) that contradicts how the process was started.

    Args:
        launcher: ``pytorch`` (torchrun's environment must be set), ``none`` (must be a single process), or None
            (whatever the environment says).
        command: The tool and its arguments, for the torchrun line of the error.
    """
    world = os.environ.get("WORLD_SIZE")
    if launcher == "pytorch" and world is None:
        raise RuntimeError(
            "--launcher pytorch needs the environment torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK): start with "
            f"`torchrun --nproc-per-node N {command} --launcher pytorch`"
        )
    if launcher == "none" and int(world or "1") > 1:
        raise RuntimeError(f"--launcher none, but torchrun started {world} processes: use --launcher pytorch")


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, or (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def balanced_shards(weights: Sequence[int], world_size: int) -> list[list[int]]:
    """Split item indices into ``world_size`` shards of about equal total weight (greedy, largest first).

    Deterministic: items are taken by weight, largest first (the lower index first on ties), each going to the
    shard of least weight so far (the lower rank first on ties); every shard is returned in index order. Every
    rank computes the same split from the same weights, with no communication.
    """
    heap = [(0, rank) for rank in range(world_size)]  # (load, rank): the least loaded, then the lowest rank
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, rank = heapq.heappop(heap)
        shards[rank].append(index)
        heapq.heappush(heap, (load + weights[index], rank))
    return [sorted(shard) for shard in shards]


def finish_distributed() -> None:
    """Leave the process group (a no-op in one process): every rank calls it before it exits."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
