"""A rank lost mid-run: the collectives of the others end in one line naming it (wsss.utils.distributed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wsss.utils.distributed import Place, lost_peer

REPO = Path(__file__).resolve().parents[2]
GLOO = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [{}]:{}. This is typically "
    "caused by a remote worker crashing. Check the logs of the remote worker before reporting an error. GLHF!"
)


def places() -> list[Place]:
    """Two nodes of two ranks each."""
    a, b = frozenset({"10.0.0.1"}), frozenset({"10.0.0.2"})
    return [Place("a", 0, a, frozenset({29500, 41000})), Place("a", 0, a, frozenset({41001})),
            Place("b", 1, b, frozenset({52000})), Place("b", 1, b, frozenset({0x1234}))]  # fmt: skip


def test_the_lost_rank_is_named_by_its_port_or_its_node_by_its_address():
    line = lost_peer("all_gather_objects", GLOO.format("10.0.0.2", 52000), 0, 4, places())
    assert line.startswith("lost rank 2 (node 1, host b) during all_gather_objects (Connection closed by peer ")
    assert "\n" not in line and "GLHF" not in line and "pair.cc" not in line
    swapped = lost_peer("barrier", GLOO.format("10.0.0.2", 0x3412), 1, 4, places())  # gloo's byte order
    assert swapped.startswith("lost rank 3 (node 1, host b) during barrier")
    by_node = lost_peer("barrier", GLOO.format("10.0.0.2", 7), 0, 4, places())
    assert by_node.startswith("lost node 1 (host b, rank(s) 2, 3) during barrier")
    own_node = lost_peer("barrier", GLOO.format("10.0.0.2", 7), 2, 4, places())
    assert own_node.startswith("lost one of rank(s) 3 of this node (node 1, host b) during barrier")
    assert lost_peer("barrier", GLOO.format("10.9.9.9", 7), 0, 4, places()).startswith(
        "lost another rank (at 10.9.9.9:7) during barrier"
    )
    assert lost_peer("barrier", "NCCL error: remote process exited", 1, 2, []).startswith("lost rank 0 during")


SCRIPT = textwrap.dedent("""
    import os
    from wsss.utils.distributed import all_gather_objects, barrier, finish_distributed, init_distributed
    info = init_distributed("cpu")
    barrier()
    if info.rank == 2:
        os._exit(9)
    try:
        all_gather_objects(info.rank)
    except OSError as err:  # what the tools catch and print as one line
        print(f"rank {info.rank}: {err}")
        finish_distributed()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_rank_that_dies_is_named_by_each_survivor_in_one_line():
    """Rank 2 of 3 exits before all_gather_objects: ranks 0 and 1 each raise PeerLostError naming rank 2 (once a
    gloo traceback, ``Connection closed by peer``), and leave the process group."""
    port = str(free_port())
    procs = []
    for rank in range(3):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "3", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    results = [p.communicate(timeout=300) for p in procs]
    for rank in (0, 1):
        out, err = results[rank]
        assert procs[rank].returncode == 0, err[-2000:]
        assert out.startswith(f"rank {rank}: lost rank 2 (node 0, host {socket.gethostname()}) during "
                              "all_gather_objects ("), out  # fmt: skip
        assert "[127.0.0.1]:" in out and "by peer" in out and out.count("\n") == 1  # gloo: closed, or reset
        assert "Traceback" not in err
    assert procs[2].returncode == 9


@pytest.mark.parametrize("message", ["Connection closed by peer [1.2.3.4]:5", "broken pipe"])
def test_collective_turns_only_a_lost_peer_into_peer_lost_error(message):
    from wsss.utils.distributed import PeerLostError, collective

    with pytest.raises(PeerLostError, match="^lost another rank"):
        with collective("barrier"):
            raise RuntimeError(message)
    with pytest.raises(RuntimeError, match="^shape mismatch$"):
        with collective("barrier"):
            raise RuntimeError("shape mismatch")
