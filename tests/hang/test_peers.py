"""The liveness probe behind "rank 2 (n2, ...): its process has ended": real sockets, one process.

The "unreachable from here" finding needs a host that does not answer: tests/multinode.
"""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator

import pytest

from multigpu.instruments.hang import peers


@pytest.fixture
def directory() -> Iterator[None]:
    """This process as rank 0 of 3: rank 1 listens (alive), rank 2's port is closed (ended)."""
    alive = socket.create_server(("127.0.0.1", 0))
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        closed_port = gone.getsockname()[1]
    table = [("me", "127.0.0.1", 1), ("n1", "127.0.0.1", alive.getsockname()[1]),
             ("n2", "127.0.0.1", closed_port)]  # fmt: skip
    peers.start(0, lambda mine: [mine if r == 0 else row for r, row in enumerate(table)], "")
    try:
        yield
    finally:
        alive.close()
        peers._peers.clear()
        if peers._listener is not None:
            peers._listener.close()


def test_probe_tells_alive_from_ended(directory: None) -> None:
    assert peers._peers[0].host == socket.gethostname() and peers._peers[0].port > 0
    found = peers.ask_peers(timeout_s=1.0)
    assert found[1] == "answers"
    assert found[2].startswith("its process has ended")
    assert 0 not in found  # never itself


def test_one_line_after_a_failed_collective_only(directory: None) -> None:
    out = io.StringIO()
    error = RuntimeError("[gloo/transport/tcp/pair.cc:1] Timed out waiting 1000ms for recv")
    peers.report_lost_peers(error, out)
    line = out.getvalue()
    assert line.count("\n") == 1
    assert line.startswith(f"multigpu: rank 0 ({socket.gethostname()}): a collective failed "
                           "(Timed out waiting 1000ms for recv); rank 2 (n2, 127.0.0.1): "
                           "its process has ended")  # fmt: skip
    assert "rank 1" not in line  # it answers: not lost
    out = io.StringIO()
    peers.report_lost_peers(ValueError("a bug in the script"), out)
    peers.report_lost_peers(None, out)  # the script ended normally
    assert out.getvalue() == ""


def test_no_line_under_multigpu_run_when_every_other_rank_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rank 0 failed first (a tracker's full disk) and rank 1's collective failed with it: the
    # launcher's last line names rank 0's cause; this line came before it and said nothing more.
    alive = socket.create_server(("127.0.0.1", 0))
    table = [("n0", "127.0.0.1", alive.getsockname()[1]), ("me", "127.0.0.1", 1)]
    peers.start(1, lambda mine: [mine if r == 1 else row for r, row in enumerate(table)], "")
    error = RuntimeError("Connection closed by peer [127.0.0.1]:1234")
    try:
        out = io.StringIO()
        monkeypatch.setenv("MULTIGPU_AGENT_PID", "1")
        peers.report_lost_peers(error, out)
        assert out.getvalue() == ""
        monkeypatch.delenv("MULTIGPU_AGENT_PID")  # plain torchrun: the line is all it gets
        peers.report_lost_peers(error, out)
        assert "every other rank answers: the rank that failed first holds the cause" in (
            out.getvalue()
        )
    finally:
        alive.close()
        peers._peers.clear()
        if peers._listener is not None:
            peers._listener.close()
