"""Where this process sits in a distributed job: ``detect(environ) -> ClusterEnv``.

Sources, most specific first: Ray Train (a worker of ``TorchTrainer``: Ray's mark, ``NODE_RANK``
and torchrun's position variables, no torchrun agent) > torchrun (any ``env://`` launcher) >
SLURM (an srun step) > MPI (mpirun/mpiexec) > single process. Each lives in its own module with
a pure ``from_environ(environ) -> ClusterEnv | None``. When two are present, the *innermost*
launcher tells the truth and the outer one's variables were merely inherited:

- ``srun torchrun`` / ``mpirun torchrun``: torchrun's agent (``TORCHELASTIC_RUN_ID``) wins,
  without comparison.
- ``mpirun`` inside an allocation: Open MPI and Hydra start their per-node daemons with srun,
  so every rank inherits the daemons' step (one task per node). MPI wins when its rank/size
  differ from the step's; when they agree (``srun --mpi=pmi2`` direct launch) SLURM is used.
- ``RANK``/``WORLD_SIZE`` without torchrun's agent, inside an srun step or MPI job: either a
  launcher inside each task spawned workers (``multigpu.testing``, ``mp.spawn``: then every
  ``env://`` variable is set and ``WORLD_SIZE`` is a multiple of the outer size) or a job
  script exported them by hand next to the scheduler's (then they are incomplete, usually no
  per-task ``RANK``, and must agree with the scheduler, which is used). Anything else, such as
  ``WORLD_SIZE=2`` in a 4-task step, is an EnvError naming both, because it would hang.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from multigpu.env import mpi, ray, single, slurm, torchrun
from multigpu.env._common import to_int, value
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError

__all__ = ["ClusterEnv", "detect"]

log = logging.getLogger(__name__)


def detect(environ: Mapping[str, str] | None = None) -> ClusterEnv:
    """Work out this process's rank, world size, node and rendezvous address.

    A pure function of ``environ`` (default ``os.environ``): nothing is written, nothing is
    asked over the network. ``source`` of the answer says which launcher it came from.

    Raises:
        EnvError: the variables are incomplete, malformed or contradict each other; the message
            names them and says how to fix it.

    Example:
        >>> detect({}).world_size
        1
        >>> env = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        ...               "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"})
        >>> env.source, env.rank, env.local_world_size
        ('torchrun', 1, 2)
    """
    found = _detect(os.environ if environ is None else environ)
    log.debug("detected %s", found)
    return found


def _detect(environ: Mapping[str, str]) -> ClusterEnv:
    # Ray Train sets torchrun's variables itself (and a SLURM job's ray cluster inherits the
    # step's): its workers are Ray's, whatever else the environment holds.
    found = ray.from_environ(environ)
    if found is not None:
        return found
    # torchrun's agent is the innermost launcher: no scheduler is even read then.
    outer = None if torchrun.is_elastic(environ) else _scheduler(environ)
    if outer is not None and torchrun.is_present(environ) and not torchrun.is_complete(environ):
        _check_hints(environ, outer)
        return outer
    inner = torchrun.from_environ(environ)
    if inner is not None and outer is not None:
        _check_nested(inner, outer)
    return inner or outer or single.from_environ(environ)


def _scheduler(environ: Mapping[str, str]) -> ClusterEnv | None:
    """The SLURM step or MPI job this process belongs to, or None."""
    step = slurm.from_environ(environ)
    if step is None:
        return mpi.from_environ(environ)
    position = mpi.world_position(environ)
    if position is None or position == (step.rank, step.world_size):
        return step
    # mpirun inside the step: the step's tasks are MPI's per-node daemons, the ranks are MPI's.
    log.debug("MPI rank/size %s inside SLURM step %s: MPI launched us", position, step)
    return mpi.from_environ(environ)


def _check_nested(inner: ClusterEnv, outer: ClusterEnv) -> None:
    """A complete ``env://`` set inside a scheduler job must look like a nested launcher's."""
    multiple = inner.world_size % outer.world_size == 0
    same_world = inner.world_size == outer.world_size
    if multiple and not (same_world and inner.rank != outer.rank):
        return
    raise EnvError(
        f"RANK={inner.rank} WORLD_SIZE={inner.world_size} are set without torchrun's agent "
        f"(TORCHELASTIC_RUN_ID unset) but {outer.source} started this process as rank "
        f"{outer.rank} of {outer.world_size}; expected the same rank and size, or WORLD_SIZE a "
        f"multiple of {outer.world_size} when a launcher inside each task spawned the workers; "
        f"unset RANK and WORLD_SIZE to let multigpu read {outer.source}'s variables, or start "
        f"the workers with `srun torchrun` / `multigpu run`"
    )


def _check_hints(environ: Mapping[str, str], outer: ClusterEnv) -> None:
    """Position variables exported by hand next to a scheduler's must agree with it."""
    absent = ", ".join(n for n in torchrun.REQUIRED if value(environ, n) is None)
    fix = (
        f"unset it (multigpu reads {outer.source}'s own variables) or set it from them, or "
        f"start the workers with `srun torchrun` / `multigpu run`"
    )
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        text = value(environ, name)
        if text is None:
            continue
        given, expected = to_int(name, text, minimum=0, fix=fix), getattr(outer, name.lower())
        if given != expected:
            raise EnvError(
                f"{name}={given} but {outer.source} started this process with "
                f"{name.lower()}={expected} ({absent} not set, so this is not a torchrun "
                f"worker); expected {name} to match; {fix}"
            )
