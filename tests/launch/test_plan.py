"""Option parsing and plan building: pure functions, nothing is launched."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from torch.distributed.run import parse_args as torchrun_parse_args

from multigpu.cli.args import split_own_args as split_launch_args
from multigpu.cli.main import build_run_parser, options_from_namespace
from multigpu.errors import UsageError
from multigpu.launch.options import LaunchOptions, parse_nnodes
from multigpu.launch.plan import build_plan, request_devices
from multigpu.launch.ports import check_port_free, is_local_address, store_port
from multigpu.launch.train import wants_one_process


def parse(*argv: str) -> LaunchOptions:
    ns = build_run_parser().parse_args(list(argv))
    return options_from_namespace(
        ns, script=ns.training_script, script_args=ns.training_script_args
    )


def plan_for(*argv: str, gpus: int = 0, cores: int = 4, environ: dict[str, str] | None = None):
    options = parse(*argv)
    request = request_devices(options, gpu_count=gpus, cores=cores)
    fake = [SimpleNamespace(index=i, name=f"GPU{i}") for i in range(gpus)]
    return build_plan(
        options,
        request,
        environ=environ or {},
        cores=cores,
        gpus=fake if request.kind == "cuda" else (),  # type: ignore[arg-type]
    )


def test_torchrun_options_round_trip_through_torchruns_own_parser() -> None:
    plan = plan_for(
        "--cpu", "2", "--max_restarts", "2", "--monitor-interval", "0.5", "--redirects", "3",
        "--log_dir", "/tmp/logs", "--rdzv-conf", "join_timeout=30,last_call_timeout=1",
        "train.py", "--lr", "0.1", "--cpu", "7",
    )  # fmt: skip
    args = torchrun_parse_args(list(plan.torchrun_args))
    assert args.nproc_per_node == "2"
    assert args.max_restarts == 2
    assert args.monitor_interval == 0.5
    assert args.redirects == "3"
    assert args.log_dir == "/tmp/logs"
    assert args.rdzv_conf == "join_timeout=30,last_call_timeout=1"
    assert args.standalone  # one node, no rendezvous option
    assert args.training_script == "train.py"
    assert args.training_script_args == ["--lr", "0.1", "--cpu", "7"]  # the script's, untouched


def test_module_flag_and_defaults_left_to_torchrun() -> None:
    plan = plan_for("--cpu", "1", "-m", "pkg.train", "--epochs", "1")
    assert plan.torchrun_args == (
        "--nproc-per-node=1", "--module", "--local-addr=127.0.0.1", "--standalone", "pkg.train",
        "--epochs", "1",
    )  # fmt: skip


def test_cpu_processes_share_the_cores() -> None:
    plan = plan_for("--cpu", "2", "t.py", cores=4)
    assert (plan.device, plan.nproc_per_node, plan.threads_per_process) == ("cpu", 2, 2)
    assert plan.env["OMP_NUM_THREADS"] == plan.env["MKL_NUM_THREADS"] == "2"
    assert plan.env["MULTIGPU_DEVICE"] == "cpu"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env  # no restarts: torch's default
    assert "MULTIGPU_BACKEND" not in plan.env
    assert plan_for("--cpu", "3", "t.py", cores=2).threads_per_process == 1  # never 0


def test_a_store_per_attempt_only_where_workers_may_restart() -> None:
    for argv in (("--max-restarts", "1"), ("--nnodes", "1:2"), ("--nnodes", "2")):
        plan = plan_for("--cpu", "2", *argv, "t.py")
        assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1", argv
    for argv in ((), ("--max-restarts", "0"), ("--nnodes", "1")):
        plan = plan_for("--cpu", "2", *argv, "t.py")
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env, argv


def test_user_thread_and_store_settings_win() -> None:
    environ = {"OMP_NUM_THREADS": "3", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    plan = plan_for("--cpu", "2", "--backend", "gloo", "t.py", environ=environ)
    assert plan.threads_per_process is None
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        assert name not in plan.env
    assert plan.env["MULTIGPU_BACKEND"] == "gloo"


def test_cpu_only_default_is_one_process_with_all_cores_and_says_why() -> None:
    plan = plan_for("t.py", cores=8)
    assert (plan.nproc_per_node, plan.threads_per_process) == (1, 8)
    (note,) = plan.notes
    assert "see --help" in note and "--cpu N" in note and "\n" not in note and len(note) <= 100
    assert "0.55" in build_run_parser().format_help()


@pytest.mark.parametrize(
    ("value", "processes"), [("2", 2), ("cpu", 4), ("auto", 4)]
)  # torchrun's meanings on a machine without GPUs
def test_nproc_per_node_without_gpus(value: str, processes: int) -> None:
    assert plan_for("--nproc-per-node", value, "t.py", cores=4).nproc_per_node == processes


def test_gpus_one_process_per_gpu_in_pci_order() -> None:
    plan = plan_for("t.py", gpus=2)
    assert (plan.device, plan.nproc_per_node) == ("cuda", 2)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "MULTIGPU_DEVICE" not in plan.env
    assert request_devices(parse("--nproc-per-node", "1", "t.py"), gpu_count=2, cores=2).gpus == "1"


def test_dp_is_one_process_seeing_every_gpu() -> None:
    options = LaunchOptions(script="m", one_process=True)
    request = request_devices(options, gpu_count=2, cores=2)
    fake = [SimpleNamespace(index=i, name="g") for i in range(2)]
    plan = build_plan(options, request, environ={}, cores=2, gpus=fake)  # type: ignore[arg-type]
    assert plan.nproc_per_node == 1 and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    with pytest.raises(UsageError, match="--strategy dp"):
        request_devices(LaunchOptions(script="m", cpu=2, one_process=True), gpu_count=0, cores=2)


@pytest.mark.parametrize(
    ("argv", "gpus", "match"),
    [
        (["--cpu", "2", "--gpus", "1"], 0, "together"),
        (["--cpu", "2", "--nproc-per-node", "3"], 0, "contradicts --cpu 2"),
        (["--cpu", "2", "--nproc-per-node", "1"], 0, "contradicts --cpu 2"),  # equal to default
        (["--backend", "nccl"], 0, "nccl needs CUDA GPUs"),
        (["--backend", "nccl", "--cpu", "2"], 4, "nccl needs CUDA GPUs"),
        (["--nproc-per-node", "gpu"], 0, "has none"),
        (["--nproc-per-node", "0"], 0, "expected >= 1"),
        (["--nproc-per-node", "many"], 0, "not understood"),
        (["--gpus", "2", "--nproc-per-node", "3"], 2, "contradicts the 2 GPU"),
        (["--cpu", "0"], 0, "--cpu 0 is not a number of processes"),
        (["--cpu", "x"], 0, "--cpu x is not a number of processes"),
        (["--cpu", "-1"], 0, "--cpu -1 is not a number of processes"),
        (["--backend", "mpi"], 0, "invalid choice"),
        (["--nnodes", "2", "--node-rank", "2"], 0, "--node-rank 2 is not a node of --nnodes 2"),
        (["--nnodes", "1:4", "--node-rank", "4"], 0, "expected 0 to 3"),
        (["--node-rank", "-1"], 0, "--node-rank -1 is not a node of --nnodes 1"),
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], gpus: int, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        plan_for(*argv, "t.py", gpus=gpus)
    assert "\n" not in str(info.value)


def test_node_rank_is_checked_where_torchrun_uses_it_only() -> None:
    # c10d's rendezvous assigns node ranks itself and ignores --node-rank, as torchrun does.
    plan = plan_for("--nnodes", "2", "--node-rank", "5", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "127.0.0.1:29500", "--cpu", "1", "t.py", gpus=0)  # fmt: skip
    assert plan.nproc_per_node == 1


def test_rendezvous_store_port_to_check() -> None:
    assert store_port(parse("t.py")) is None  # --standalone: torchrun picks a free port
    assert store_port(parse("--master-port", "29511", "t.py")) == ("--master-port 29511", 29511)
    assert store_port(parse("--nnodes", "2", "--node-rank", "1", "t.py")) is None  # a client
    assert store_port(parse("--nnodes", "2", "t.py"))[1] == 29500  # type: ignore[index]
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint"]
    assert store_port(parse(*c10d, "127.0.0.1:29512", "t.py"))[1] == 29512  # type: ignore[index]
    # Several agents of one job may share this machine: the first one hosts, the others join.
    assert store_port(parse("--nnodes", "2", *c10d, "127.0.0.1:29512", "t.py")) is None
    assert store_port(parse(*c10d, "192.0.2.1:29512", "t.py")) is None  # not this machine
    assert plan_for("--master-port", "29511", "t.py").torchrun_args.count("--standalone") == 0


def test_ports_and_local_addresses() -> None:
    assert is_local_address("127.0.0.1") and is_local_address("localhost")
    assert not is_local_address("192.0.2.1")  # TEST-NET-1, never assigned
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} is already in use"):
            check_port_free(port, option=f"--master-port {port}")
    check_port_free(port, option="--master-port")  # closed again: free


def test_nnodes_parsing() -> None:
    assert parse_nnodes("2") == (2, 2) and parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "3:1", "a", "1:2:3"):
        with pytest.raises(UsageError, match="--nnodes"):
            parse_nnodes(bad)


def test_train_arguments_split_between_launcher_and_job() -> None:
    from multigpu.cli.main import build_train_parser

    actions = build_train_parser()._actions
    argv = ["--epochs", "2", "--cpu", "2", "--out=/tmp/o", "--max-restarts=1", "--dry-run", "-x"]
    launch, job = split_launch_args(argv, actions)
    assert launch == ["--cpu", "2", "--max-restarts=1", "--dry-run"]
    assert job == ["--epochs", "2", "--out=/tmp/o", "-x"]
    assert split_launch_args(["--cpu", "2", "--", "--cpu", "3"], actions) == (
        ["--cpu", "2"], ["--cpu", "3"],
    )  # fmt: skip
    assert wants_one_process(["--strategy", "dp"]) and not wants_one_process(["--strategy", "ddp"])
