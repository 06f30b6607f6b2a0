"""Every torch API that is private or moved between releases, in one place, behind a version gate.

multigpu supports ``torch>=2.4``. What changed between releases, or is private, is reached through
this package only (``sharding``, ``checkpoint``, ``elastic``, ``training``), and
``tests/core/test_torch_compat*.py`` have one test per entry that fails loudly
when a torch release changes it, so upgrading torch is this package and those tests.

- **FSDP2** (``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy``, ``CPUOffloadPolicy``):
  public in ``torch.distributed.fsdp`` since 2.6, private ``torch.distributed._composable.fsdp``
  in 2.4 and 2.5.
- **DTensor**: public ``torch.distributed.tensor`` since 2.5, ``torch.distributed._tensor`` before.
- **A module's own tensors**: ``nn.Module._parameters`` / ``_buffers`` (meta-device
  materialization swaps whole tensors in and out of them).
- **FSDP2's process groups**: ``FSDPModule._get_fsdp_state()._fsdp_param_groups`` (one
  ``_fsdp_param_group`` before 2.8) and their ``mesh_info`` / ``post_forward_mesh_info``, which
  keep the groups alive after ``destroy_process_group`` (dropped at teardown); so does
  ``DeviceMesh._pg_registry`` (2.9+).
- **DCP metadata unpickling**: a DCP checkpoint's ``.metadata`` file is a pickle, which torch reads
  with plain ``pickle.load`` (any code in it runs). ``DCP_METADATA_GLOBALS`` lists the globals a
  metadata file written by torch names — some private (``_StorageInfo``, ``_get_layout``,
  ``_MEM_FORMAT_ENCODING``) — so that multigpu can read one with an allow-list instead.
- **An optimizer step without hooks** (``Optimizer.profile_hook_step``'s ``hooked`` wrapper and
  its ``__wrapped__``): ``step_without_hooks`` makes an optimizer's state before a checkpoint is
  loaded into it, unseen by what counts steps through hooks.
- **Where store servers are made**: the module name ``TCPStore`` of the c10d and static
  rendezvous backends and of ``torch.distributed.rendezvous`` (``env://``, ``tcp://``), and
  ``DynamicRendezvousHandler._create_tcp_store_server``: for the time of a block they make their
  servers through multigpu (``store_listen``: bound to one address, not every interface).
- **The elastic agent's protected methods** (``AGENT_OVERRIDES``): ``launch/agent/``
  overrides ``LocalElasticAgent``'s worker monitor (stopped workers let go on; the restart it
  leads to said by ``restart_reports``) and its exit barrier (``exit_agreement``) — torch offers
  no hooks for them; the rest goes through the public ``run`` and ``RendezvousHandler`` — and
  torch's ``launch_agent`` is made to build that agent and a handler that waits for the store
  through the module names ``launcher.api.LocalElasticAgent`` and
  ``registry.get_rendezvous_handler`` (``launch_agent_made_by``). ``elastic_agent_class``
  refuses a torch whose agent lacks them; ``elastic``'s docstring lists every such name with its
  canary.
- **The default group's store** (``distributed_c10d._get_default_store``): where the hang
  watchdog's ranks leave their reports outside any collective (``default_store``).
- **PowerSGD on CPU tensors where CUDA is present**: ``powerSGD_hook`` ends with
  ``if torch.cuda.is_available(): torch.cuda.synchronize(device)`` on the gradients' device,
  which raises for CPU processes on a GPU machine (seen with torch 2.11; the same code is in
  2.13). ``powersgd_hook_for`` gives CPU models a copy of the hook that sees no CUDA.
- **ShardedTensor imported before the first process group** (``import_before_process_groups``):
  imported later (by FSDP or DCP, which multigpu imports on first use), it leaves the default
  group's gloo threads alive after ``destroy_process_group`` under DDP.
- **DTensor's redistribution logger** (``torch.distributed.tensor._redistribute``): it warns on
  every rank that a partial norm on a 2-D mesh is reduced by one all-reduce per mesh axis;
  ``quiet_sequential_redistribution`` drops that one message while the tensor-parallel
  strategy makes its gradient norms whole (a handful of scalars) and while a whole state dict
  is gathered (once per save), where one all-gather per axis costs nothing that matters.
- **Gradient norms by parts** (``torch.nn.utils.get_total_norm``, ``clip_grads_with_norm_``):
  public since 2.6; before, ``grad_norm`` and ``clip_with_norm`` do the same arithmetic (the
  pipeline sums its stages' norms across processes between the two).
- **What a loss averaged over** (``NllLossBackward0._saved_reduction`` / ``_saved_target`` /
  ``_saved_ignore_index``, read back unsigned): ``mean_over_ignored`` finds a cross-entropy
  mean whose targets include ignored ones, for ``multigpu verify``'s explanation.
- **Pipeline stages** (``torch.distributed.pipelining``): ``torch.export``'s unflattening names
  the second call of a module ``name@1`` (``unflattened_name`` maps it back); schedules scale
  the gradients by the micro-batches themselves since 2.7 (``unscaled_schedule_kwargs`` turns
  that off where it exists: the pipeline scales once, a tensor shared by two stages included).
- **A GradScaler's per-optimizer record** (``GradScaler._per_optimizer_states``, ``OptState``,
  ``_refresh_per_optimizer_state``): a replica group forgets the unscaling of a share it set
  aside and makes every group's found-inf agree after the groups summed their gradients
  (``scaler_unscaled``, ``scaler_forget_unscale``, ``scaler_set_found_inf``).
- **What DDP imports** (``DDP_IMPORTS``): ``torch._dynamo``, on the first construction; a fork
  server preloads it so that its forked DDP workers do not each pay for it.
- **torch.compile's counters and the partitioner's budget** (``compile``): the seconds spent
  compiling (``calculate_time_spent``), the graph breaks (``counters["graph_break"]``) for the
  one-line report of ``init(compile=)``, and ``torch._functorch.config
  .activation_memory_budget`` for a memory-budget activation checkpointing policy, set while a
  backend of its own compiles (``backend_with_memory_budget``, on ``lookup_backend``).
- **A DataLoader worker's identity** (``torch.utils.data._utils.worker._worker_info``, what
  ``get_worker_info()`` returns): ``read_outside_worker`` hides it while a stream advances, so
  that a stream which splits itself among workers (Hugging Face ``datasets``' does) is read whole
  by each (``multigpu.data.stream_loader`` keeps each worker's batches itself).
- **An adopted group's timeout** (``distributed_c10d._set_pg_timeout``, the gloo backend's
  ``options._timeout``): ``multigpu.init`` gives a group made by someone else (Ray Train's,
  1800 s) its own timeout (``set_group_timeout``; ``group_timeout`` reads it back).
- **torchft's manager server** (``torchft``, not torch: the optional extra ``ft``): torchft 0.2
  binds it to every interface, hard-coded; ``manager_server_bound_to`` binds it to one address.
"""

from __future__ import annotations

from multigpu.torch_compat.checkpoint import (
    DCP_METADATA_GLOBALS,
    dcp_metadata_global_allowed,
    step_without_hooks,
)
from multigpu.torch_compat.compile import (
    activation_memory_budget,
    backend_with_memory_budget,
    compile_seconds,
    current_memory_budget,
    graph_breaks,
)
from multigpu.torch_compat.dataloader import read_outside_worker
from multigpu.torch_compat.elastic import (
    AGENT_ATTRIBUTES,
    AGENT_OVERRIDES,
    STORE_MODULES,
    default_store,
    elastic_agent_class,
    launch_agent_made_by,
    store_servers_made_by,
)
from multigpu.torch_compat.process_group import group_timeout, set_group_timeout
from multigpu.torch_compat.sharding import (
    FSDP_MIN_VERSION,
    REDISTRIBUTE_LOGGER,
    SHARDED_TENSOR_MODULE,
    cpu_offload_policy,
    distribute_like,
    drop_fsdp_process_groups,
    drop_mesh_process_groups,
    dtensor_from_local_like,
    fsdp_module_class,
    fully_shard,
    fully_shard_takes_module_lists,
    import_before_process_groups,
    is_dtensor,
    mixed_precision_policy,
    own_tensor_tables,
    quiet_sequential_redistribution,
)
from multigpu.torch_compat.torchft import manager_server_bound_to
from multigpu.torch_compat.training import (
    DDP_IMPORTS,
    clip_with_norm,
    grad_norm,
    mean_over_ignored,
    powersgd_hook_for,
    scaler_forget_unscale,
    scaler_set_found_inf,
    scaler_unscaled,
    unflattened_name,
    unscaled_schedule_kwargs,
    without_cuda,
)
from multigpu.torch_compat.version import TORCH_VERSION

__all__ = [
    "AGENT_ATTRIBUTES",
    "AGENT_OVERRIDES",
    "DCP_METADATA_GLOBALS",
    "DDP_IMPORTS",
    "FSDP_MIN_VERSION",
    "REDISTRIBUTE_LOGGER",
    "SHARDED_TENSOR_MODULE",
    "STORE_MODULES",
    "TORCH_VERSION",
    "activation_memory_budget",
    "backend_with_memory_budget",
    "clip_with_norm",
    "compile_seconds",
    "cpu_offload_policy",
    "current_memory_budget",
    "dcp_metadata_global_allowed",
    "default_store",
    "distribute_like",
    "drop_fsdp_process_groups",
    "drop_mesh_process_groups",
    "dtensor_from_local_like",
    "elastic_agent_class",
    "fsdp_module_class",
    "fully_shard",
    "fully_shard_takes_module_lists",
    "grad_norm",
    "graph_breaks",
    "group_timeout",
    "import_before_process_groups",
    "is_dtensor",
    "launch_agent_made_by",
    "manager_server_bound_to",
    "mean_over_ignored",
    "mixed_precision_policy",
    "own_tensor_tables",
    "powersgd_hook_for",
    "quiet_sequential_redistribution",
    "read_outside_worker",
    "scaler_forget_unscale",
    "scaler_set_found_inf",
    "scaler_unscaled",
    "set_group_timeout",
    "step_without_hooks",
    "store_servers_made_by",
    "unflattened_name",
    "unscaled_schedule_kwargs",
    "without_cuda",
]
