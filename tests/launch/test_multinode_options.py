"""Multi-node launch options: rendezvous pass-through, ``--iface``, ``--timeout`` and its bounds.

Pure planning, plus the two run-time bounds on real objects (a socket, torch's launcher module).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from argparse import Namespace
from collections.abc import Iterable
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)
from torch.distributed.run import parse_args as torchrun_parse_args

from multigpu.cli.args import split_own_args as split_launch_args
from multigpu.cli.main import build_train_parser
from multigpu.common.host import interface_names
from multigpu.errors import UsageError
from multigpu.launch.ports import check_interface
from multigpu.launch.run import describe_agent_error, root_cause
from multigpu.launch.timeouts import (
    job_timeout_s,
    rendezvous_conf,
    store_call_bound,
)
from tests.launch._util import child_env
from tests.launch.test_plan import plan_for

C10D = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400"]


def _conf(plan) -> dict[str, str]:  # type: ignore[no-untyped-def]
    text = torchrun_parse_args(list(plan.torchrun_args)).rdzv_conf
    return dict(item.split("=", 1) for item in text.split(",") if item)


def test_c10d_and_elastic_options_pass_through_with_bounded_waits() -> None:
    plan = plan_for("--cpu", "1", *C10D, "--rdzv-id", "job7", "--node-rank", "1", "t.py")
    args = torchrun_parse_args(list(plan.torchrun_args))
    assert (args.nnodes, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == (
        "2", "c10d", "node0:29400", "job7",
    )  # fmt: skip
    assert args.node_rank == 1 and not args.standalone  # several nodes: no --standalone
    assert _conf(plan) == {
        "join_timeout": "300", "read_timeout": "300", "last_call_timeout": "30",
        "close_timeout": "30", "keep_alive_interval": "5", "keep_alive_max_attempt": "3",
    }  # fmt: skip
    assert plan.timeout_s == 300 and "MULTIGPU_TIMEOUT" not in plan.env
    elastic = plan_for("--cpu", "1", "--nnodes", "1:2", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", "node0:29400", "t.py")  # fmt: skip
    args = torchrun_parse_args(list(elastic.torchrun_args))
    assert args.nnodes == "1:2" and not args.standalone


def test_timeout_sets_the_workers_and_every_launcher_wait() -> None:
    plan = plan_for("--cpu", "2", *C10D, "--timeout", "12.5",
                    "--rdzv-conf", "join_timeout=900,is_host=1", "t.py")  # fmt: skip
    assert plan.env["MULTIGPU_TIMEOUT"] == "12.5" and plan.timeout_s == 12.5
    # The user's rendezvous settings win; ours fill the rest (torch reads whole seconds).
    assert _conf(plan) == {
        "join_timeout": "900", "is_host": "1", "read_timeout": "13", "last_call_timeout": "4",
        "close_timeout": "13", "keep_alive_interval": "1", "keep_alive_max_attempt": "3",
    }  # fmt: skip
    static = plan_for("--cpu", "1", "--nnodes", "2", "--master-addr", "n0", "--timeout", "7",
                      "t.py")  # fmt: skip
    assert _conf(static) == {"timeout": "7"}  # the static store's connect timeout
    one = plan_for("--cpu", "2", "--timeout", "5", "t.py")
    assert _conf(one)["join_timeout"] == "5" and "--standalone" in one.torchrun_args
    plain = plan_for("--cpu", "2", "t.py")  # one node, no --timeout: torchrun's args untouched
    assert not any(a.startswith("--rdzv-conf") for a in plain.torchrun_args)
    assert plan_for("--cpu", "2", "t.py", environ={"MULTIGPU_TIMEOUT": "40"}).timeout_s == 40
    with pytest.raises(UsageError, match="MULTIGPU_TIMEOUT='soon'"):
        plan_for("--cpu", "2", "t.py", environ={"MULTIGPU_TIMEOUT": "soon"})
    assert "300 s for any collective" in plain.describe()


def test_timeout_helpers() -> None:
    assert job_timeout_s(3.0, {"MULTIGPU_TIMEOUT": "9"}) == 3.0
    assert rendezvous_conf("", 600, static=False) == (
        "join_timeout=600,read_timeout=600,last_call_timeout=30,close_timeout=30,"
        "keep_alive_interval=5,keep_alive_max_attempt=3"
    )
    assert rendezvous_conf("", 2, static=False) == (
        "join_timeout=2,read_timeout=2,last_call_timeout=1,close_timeout=2,"
        "keep_alive_interval=1,keep_alive_max_attempt=3"
    )
    for bad in ("0", "-1", "x", "inf"):
        with pytest.raises(UsageError, match=f"--timeout {bad} is not a number of seconds"):
            plan_for("--timeout", bad, "t.py")


def test_iface_sets_gloo_nccl_and_the_advertised_address() -> None:
    options = ["--cpu", "1", *C10D, "--iface", "lo", "t.py"]
    from multigpu.cli.main import build_run_parser, options_from_namespace
    from multigpu.launch.plan import build_plan, request_devices

    ns = build_run_parser().parse_args(options)
    opts = options_from_namespace(ns, script="t.py", script_args=[])
    request = request_devices(opts, gpu_count=0, cores=2)
    plan = build_plan(opts, request, environ={}, cores=2, iface_address="10.1.2.3")
    assert plan.env["GLOO_SOCKET_IFNAME"] == plan.env["NCCL_SOCKET_IFNAME"] == "lo"
    assert torchrun_parse_args(list(plan.torchrun_args)).local_addr == "10.1.2.3"
    ns = build_run_parser().parse_args(["--local-addr", "n0", *options])
    opts = options_from_namespace(ns, script="t.py", script_args=[])
    plan = build_plan(opts, request, environ={}, cores=2, iface_address="10.1.2.3")
    assert torchrun_parse_args(list(plan.torchrun_args)).local_addr == "n0"  # the user's wins


def test_iface_must_exist_here() -> None:
    assert "lo" in interface_names()
    assert check_interface("lo") == "127.0.0.1"
    with pytest.raises(UsageError, match="--iface nope: no such network interface") as e:
        check_interface("nope")
    assert "expected one of: " in str(e.value) and "lo" in str(e.value)


def test_train_takes_the_same_launch_options() -> None:
    actions = build_train_parser()._actions
    launch, job = split_launch_args(["--iface", "eth0", "--timeout=30", "--epochs", "1"], actions)
    assert launch == ["--iface", "eth0", "--timeout=30"] and job == ["--epochs", "1"]


def test_store_call_bound_sets_the_kernel_timeout_on_the_stores_connections() -> None:
    """A real TCPStore server and client made through the bound: the client's connection (and
    the server's end of it) carry TCP_USER_TIMEOUT; a socket opened before is left alone."""
    from torch.distributed import TCPStore

    def timeouts(fds: Iterable[int]) -> list[int]:
        found = []
        for fd in fds:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed
                continue
            if not target.startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.type == socket.SOCK_STREAM and sock.family != socket.AF_UNIX:
                    found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        return found

    make = store_call_bound(TCPStore, 7.5)
    with socket.socket() as before:
        server = make("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        opened = set(os.listdir("/proc/self/fd"))
        client = make("127.0.0.1", server.port, is_master=False)
        client.set("k", "v")
        new = [int(fd) for fd in set(os.listdir("/proc/self/fd")) - opened]
        assert 7500 in timeouts(new), timeouts(new)  # the client's connection
        assert before.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0
    del client, server


def test_agent_errors_name_the_endpoint_and_the_fix() -> None:
    args = Namespace(rdzv_endpoint="node0:29400", nnodes="2")
    try:
        try:
            raise TimeoutError("The client socket has timed out after 5000ms.")
        except TimeoutError as cause:
            raise RendezvousConnectionError("The connection to the C10d store failed") from cause
    except RendezvousConnectionError as error:
        assert root_cause(error) == "TimeoutError: The client socket has timed out after 5000ms"
        line = describe_agent_error(error, args, 5)
    here = socket.gethostname()
    assert line.startswith(f"the rendezvous store at node0:29400 is unreachable from {here} (")
    assert "--timeout 5 s" in line and "--iface" in line and "\n" not in line
    closed = RendezvousConnectionError("Failed to recv, got 0 bytes. Connection was likely closed.")
    line = describe_agent_error(closed, args, 5)
    assert line.startswith(f"the rendezvous store at node0:29400 closed its connection to {here}")
    assert "the `multigpu run` on node0 has ended" in line
    assert f"(this node, {here}: --nnodes 2)" in line
    line = describe_agent_error(RendezvousTimeoutError("join"), args, 60)
    assert "not every node joined the rendezvous at node0:29400 within 60 s" in line
    assert f"{here} expected --nnodes 2" in line
    # The store's node closed the rendezvous before it went away: the third way node1 learns
    # that node0 gave up (a race between them), named like the other two.
    line = describe_agent_error(RendezvousClosedError("The rendezvous is closed"), args, 60)
    assert line.startswith("the rendezvous at node0:29400 is closed: another node's launcher")
    assert f"(this node, {here}: --nnodes 2)" in line and "new --rdzv-id" in line


def _answer_garbage(listener: socket.socket) -> None:
    """Answer every connection as an HTTP server would (torch's client retries on it)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed: the test is over
            return
        with conn, contextlib.suppress(OSError):
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


@pytest.mark.parametrize("program", ["silent", "answers-garbage"])
def test_a_port_held_by_a_program_that_is_not_a_store_is_named_not_waited_on(
    tmp_path: Path, program: str
) -> None:
    # torch's store client would wait for a silent program forever, whatever its timeout, and
    # retry against one answering garbage; the launcher's probe left in a thread of its own
    # then aborted it at exit (SIGABRT, exit 134) after the one line.
    script = tmp_path / "t.py"
    script.write_text("print('never')\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        if program == "answers-garbage":
            threading.Thread(target=_answer_garbage, args=(listener,), daemon=True).start()
        done = subprocess.run(
            [sys.executable, "-m", "multigpu", "run", "--cpu", "1", "--nnodes", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--timeout", "2",
             str(script)],
            env=child_env({}), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # Closing alone leaves the thread blocked in accept() for the rest of the session (seen
        # in a stack dump of a later test); shutting the socket down wakes it up to return.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert (
        f"a program listens at 127.0.0.1:{port} but does not answer as a rendezvous store"
        in (lines[0])
    )
    assert "never" not in done.stdout
