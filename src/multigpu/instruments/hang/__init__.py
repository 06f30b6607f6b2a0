"""The hang explainer: record collectives, watch for a stall, say who waits where and why.

What torch covers, and what is ours (measured on torch 2.13, 2 gloo processes):

- **NCCL Flight Recorder** (``TORCH_NCCL_TRACE_BUFFER_SIZE``, dumped on a NCCL timeout with
  ``TORCH_NCCL_DUMP_ON_TIMEOUT``): torch's, for NCCL jobs; nothing here replaces or disables it.
- **Flight Recorder for gloo** (``TORCH_FR_BUFFER_SIZE``): torch 2.13 records gloo collectives
  too (op, sizes, dtypes, sequence id), but a gloo entry stays ``scheduled`` (no completion
  time), it names no source line, and the dump is a private call (``_dump_fr_trace_json``)
  that a hung rank must itself make. Not used: ``recorder`` keeps, per rank, the user's
  ``file:line``, whether each call finished, and the record in a shared mapping the launcher
  reads while the ranks are stuck — for every torch from 2.4.
- **``TORCH_DISTRIBUTED_DEBUG=DETAIL``**: wraps the group so each collective first checks that
  every rank calls the same one (an extra collective per call); left to the user for a debug
  run — ``explain`` finds the same mismatch from the records, after the fact, at no cost.
- **``monitored_barrier``** (gloo): names the ranks that miss a barrier; ``peers`` (liveness
  ports) and ``watchdog`` name them without a barrier every rank must reach.
- **Error files** (``@record``, ``TORCHELASTIC_ERROR_FILE``): torch's format, written by
  ``multigpu.common.worker_error``, read by the launcher's failure summary.
"""
