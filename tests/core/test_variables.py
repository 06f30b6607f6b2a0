"""Every ``MULTIGPU_*`` variable a user sets is read one way: a bad value is a one-line
UsageError naming the variable, the value, what is allowed and how to fix it — in the library
(``multigpu.init``) as in the launcher (``check_environment``)."""

from __future__ import annotations

import pytest

import multigpu
from multigpu.common import variables
from multigpu.common.variables import Settings
from multigpu.env import detect
from multigpu.errors import UsageError
from multigpu.instruments.hang.watchdog import report_after
from multigpu.runtime.device import rank_device

BAD = {
    "MULTIGPU_STRATEGY": ("bogus", "one of auto, single, dp, ddp, fsdp"),
    "MULTIGPU_BACKEND": ("mpi", "one of auto, nccl, gloo"),
    "MULTIGPU_DEVICE": ("tpu", "one of auto, cpu"),
    "MULTIGPU_COMPRESSION": ("gzip", "one of none, bf16, fp16, powersgd"),
    "MULTIGPU_DETERMINISTIC": ("maybe", "1 or 0"),
    "MULTIGPU_WATCHDOG": ("sometimes", "1 or 0"),
    "MULTIGPU_TIMEOUT": ("nan", "a positive number of seconds"),
    "MULTIGPU_HANG_AFTER": ("-1", "a positive number of seconds"),
    "MULTIGPU_LOG_LEVEL": ("loud", "one of debug, info, warning, error, critical"),
    "MULTIGPU_MESH": ("dp=2,pp=2", "a mesh shape ('pp' is not a mesh axis"),
    "MULTIGPU_PROFILE": ("5:3", "a window of optimizer steps FIRST:LAST, counted from 1 (the"),
    "MULTIGPU_LOG_TO": ("tensorbord", "a list of tensorboard, csv, mlflow, wandb, ray (unknown"),
    "MULTIGPU_COMPILE": ("aot-eager", "1 or 0 (also true/false), or a torch.compile backend"),
}


def test_every_variable_a_user_sets_is_checked():
    assert set(BAD) == set(variables.CHECKS)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_names_the_variable_the_value_the_choices_and_the_fix(name: str) -> None:
    value, expected = BAD[name]
    with pytest.raises(UsageError) as info:
        variables.check_environment({name: value})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{name}={value!r} (from the environment) is not {expected}")
    assert f"unset {name} or set e.g. {name}=" in message


def test_good_values_are_read_case_and_spaces_aside():
    env = {
        "MULTIGPU_STRATEGY": " FSDP ",
        "MULTIGPU_BACKEND": "Gloo",
        "MULTIGPU_DEVICE": "CPU",
        "MULTIGPU_DETERMINISTIC": "true",
        "MULTIGPU_WATCHDOG": "off",
        "MULTIGPU_TIMEOUT": "2.5",
        "MULTIGPU_LOG_LEVEL": "debug",
    }
    variables.check_environment(env)
    assert variables.strategy(env) == "fsdp" and variables.backend(env) == "gloo"
    assert variables.device(env) == "cpu" and variables.deterministic(env) is True
    assert variables.watchdog(env) is False and variables.timeout(env, 300) == 2.5
    assert variables.log_level(env) == "DEBUG"
    unset: dict[str, str] = {"MULTIGPU_STRATEGY": ""}  # empty is unset
    assert variables.strategy(unset) == "auto" and variables.deterministic(unset) is False
    assert variables.watchdog(unset) is True and variables.hang_after(unset) is None


def test_multigpu_compile_is_off_inductor_or_a_backend_and_init_checks_the_backend() -> None:
    read = variables.compile_backend
    assert [read({"MULTIGPU_COMPILE": v}) for v in ("", " 0 ", "false", "off")] == [None] * 4
    assert [read({"MULTIGPU_COMPILE": v}) for v in ("1", "TRUE", "yes")] == ["inductor"] * 3
    assert read({"MULTIGPU_COMPILE": " aot_eager "}) == "aot_eager" and read({}) is None
    with pytest.raises(UsageError, match=r"^compile='nonesuch': expected True \(inductor\)"):
        multigpu.init(strategy="single", environ={"MULTIGPU_COMPILE": "nonesuch"})
    with multigpu.init(strategy="single", environ={"MULTIGPU_COMPILE": "aot_eager"}) as ctx:
        assert ctx.compile == "aot_eager" and ctx.strategy.describe()["compile"] == "aot_eager"
    env = {"MULTIGPU_COMPILE": "aot_eager"}  # compile=False in code wins over the variable
    with multigpu.init(strategy="single", environ=env, compile=False) as ctx:
        assert ctx.compile is None and "compile" not in ctx.strategy.describe()


def test_the_readers_in_the_library_refuse_what_they_silently_took_before() -> None:
    # MULTIGPU_DEVICE=tpu meant "auto"; MULTIGPU_HANG_AFTER=x a warning and the default;
    # MULTIGPU_LOG_LEVEL=loud logging's ValueError.
    with pytest.raises(UsageError, match="MULTIGPU_DEVICE='tpu'"):
        rank_device(detect({}), "auto", Settings.read({"MULTIGPU_DEVICE": "tpu"}))
    with pytest.raises(UsageError, match="MULTIGPU_HANG_AFTER='x'"):
        report_after(300, {"MULTIGPU_HANG_AFTER": "x"})
    with pytest.raises(UsageError, match="MULTIGPU_LOG_LEVEL='loud'"):
        variables.log_level({"MULTIGPU_LOG_LEVEL": "loud"})
    # the probes' step counts (set by verify and bench for their children): int()'s ValueError
    from multigpu.session.initialize import verify_or_bench

    for name, directory in (("MULTIGPU_VERIFY_STEPS", "MULTIGPU_VERIFY_DIR"),
                            ("MULTIGPU_BENCH_STEPS", "MULTIGPU_BENCH_DIR")):  # fmt: skip
        with pytest.raises(UsageError, match=f"{name}='-3'"):
            verify_or_bench({directory: "/nowhere", name: "-3"}, 0, 1)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MULTIGPU_STRATEGY", "bogus"),
        ("MULTIGPU_BACKEND", "mpi"),
        ("MULTIGPU_DEVICE", "tpu"),
        ("MULTIGPU_DETERMINISTIC", "maybe"),
        ("MULTIGPU_TIMEOUT", "nan"),
        ("MULTIGPU_WATCHDOG", "sometimes"),
    ],
)
def test_init_refuses_a_bad_variable_before_anything_starts(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: bogus and mpi were a traceback deep in init (exit 1 in a worker), tpu and maybe
    # were taken silently, nan a ValueError from timedelta.
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=f"{name}={value!r}"):
        multigpu.init()


def test_a_value_given_in_code_is_not_overridden_by_the_variable():
    env = {"MULTIGPU_STRATEGY": "ddp", "MULTIGPU_DETERMINISTIC": "0"}
    with multigpu.init("single", deterministic=False, environ=env) as ctx:
        assert ctx.strategy.name == "single"


TORCHRUN_WORKER = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "test",
}


@pytest.mark.parametrize(
    ("kwargs", "env", "said"),
    [
        ({"seed": -1}, {}, "seed=-1 must be an integer"),
        ({}, {"MULTIGPU_STRATEGY": "bogus"}, "MULTIGPU_STRATEGY='bogus'"),
    ],
)
def test_a_usage_error_in_init_ends_a_launched_worker_in_one_line_and_exit_2(
    kwargs: dict, env: dict, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a usage error inside `with multigpu.init()` does: before, one raised by init() itself
    # left the worker with a traceback and exit code 1.
    with pytest.raises(SystemExit) as info:
        multigpu.init(environ=TORCHRUN_WORKER | env, **kwargs)
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multigpu: error: ") and said in err[0], err


def test_init_reads_only_the_environ_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the device choice and the timeout read os.environ behind init(environ=...).
    for name, bad in [
        ("MULTIGPU_DEVICE", "tpu"),
        ("MULTIGPU_TIMEOUT", "bogus"),
        ("MULTIGPU_STRATEGY", "bogus"),
        ("MULTIGPU_DETERMINISTIC", "maybe"),
    ]:
        monkeypatch.setenv(name, bad)
    with multigpu.init(environ={}) as ctx:
        assert ctx.timeout.total_seconds() == 300 and ctx.strategy.name == "single"
    with multigpu.init(environ={"MULTIGPU_TIMEOUT": "60"}) as ctx:
        assert ctx.timeout.total_seconds() == 60
    with pytest.raises(UsageError, match="MULTIGPU_TIMEOUT='x'"):
        multigpu.init(environ={"MULTIGPU_TIMEOUT": "x"})
