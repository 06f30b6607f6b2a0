"""Exceptions raised by multigpu.

Every message says what was given, what was expected and how to fix it, on one line, so the
command line can print it as is.
"""

from __future__ import annotations

from typing import ClassVar


class MultiGPUError(Exception):
    """Base class of every error multigpu raises on purpose."""

    said_in_full: ClassVar[bool] = False
    """True when the message is all a user needs (no bug to trace): a worker of ``multigpu run``
    then prints no traceback for it, and the launcher's one-line summary says it."""

    final: ClassVar[bool] = False
    """True when starting the workers again cannot help (the same input is refused again): the
    launcher's agent then ends the run instead of using one of its ``--max-restarts``."""


class UsageError(MultiGPUError, ValueError):
    """Bad input from the user (an option, an argument, a batch size); the CLI exits with 2."""

    said_in_full = True
    final = True


class DataError(UsageError):
    """Data files that cannot be read as given: a record that is not valid (invalid JSON, a
    truncated line, a wrong type), a file missing or changed since a checkpoint was saved. The
    message names the file and the record; a usage error (exit code 2): the data is the user's."""


class EnvError(MultiGPUError):
    """The process environment (torchrun, SLURM, MPI variables) is contradictory or incomplete."""


class DeviceError(MultiGPUError):
    """A requested device or backend does not exist on this machine."""


class LaunchError(MultiGPUError):
    """The launcher could not start or finish the workers."""


class CheckpointError(MultiGPUError):
    """A checkpoint is missing, incomplete, corrupt or does not match what is being restored."""


class CheckpointUnreadableError(CheckpointError):
    """A checkpoint that cannot be read as it lies on disk: not there, a save that did not
    finish, a file missing, truncated or corrupt, an index or manifest unreadable. The message
    names the checkpoint, the file and what is wrong: the whole story, which a worker of
    ``multigpu run`` does not print as a traceback (the launcher's line says it, once for the
    ranks that all found it); a restart would read the same files."""

    said_in_full = True
    final = True


class CheckpointMismatchError(CheckpointError, UsageError):
    """A complete checkpoint that does not fit the model given (other shapes, other names):
    the user's choice of checkpoint or model, so a usage error too (exit code 2)."""


class CheckpointLockedError(CheckpointError, UsageError):
    """Another live run holds the checkpoint directory (one run at a time per directory): the
    user's choice of directory, so a usage error too (exit code 2)."""


class ReplicaError(MultiGPUError):
    """Replica groups (``multigpu run --replicas``) that cannot go on exactly: their parameters
    differ, the job's end is unknown to every group left, or the lighthouse is gone. A restart
    would meet the same state, so the run ends (exit code 1) with this one line."""

    said_in_full = True
    final = True
