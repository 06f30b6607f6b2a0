"""Environments as real launchers leave them, for ``detect`` tests.

Each is the launcher-related part of ``env`` printed inside a process (plus a little unrelated
noise such as PATH), reconstructed from the sources noted: the real torchrun 2.13 run on this
machine, Slurm's ``src/common/env.c`` (``env_array_for_job``, ``env_array_for_batch_job``,
``env_array_for_step``, ``setup_env``) and published ``env`` dumps of sbatch/salloc/srun jobs,
Open MPI 4's and MPICH 4 (Hydra)'s documented per-process variables.
"""

from __future__ import annotations

NOISE = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/ada", "LANG": "C.UTF-8"}


def torchrun_standalone(rank: int) -> dict[str, str]:
    """`torchrun --standalone --nproc-per-node 2 x.py` (torch 2.13, recorded here)."""
    return {
        **NOISE,
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "37645",
        "OMP_NUM_THREADS": "1",
        "RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_ERROR_FILE": f"/tmp/torchelastic_sj/a1a3_7nrl/attempt_0/{rank}/error.json",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": "a1a35a53-586d-45e6-a53c-8c39126ceff1",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "WORLD_SIZE": "2",
    }


def torchrun_multinode(node: int, local: int, restarts: int = 0) -> dict[str, str]:
    """`torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint h0:29400`."""
    rank = node * 4 + local
    return {
        **NOISE,
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": "2",
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "h0.cluster",
        "MASTER_PORT": "44321",
        "RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": "8",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
        "TORCHELASTIC_RUN_ID": "job42",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "WORLD_SIZE": "8",
    }


# What every process of SLURM job 123456 (`sbatch -N2 --ntasks-per-node=2 train.sbatch`) has.
SLURM_JOB = {
    **NOISE,
    "SLURM_CLUSTER_NAME": "hpc",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CPUS_ON_NODE": "16",
    "SLURM_JOBID": "123456",
    "SLURM_JOB_ACCOUNT": "ml",
    "SLURM_JOB_CPUS_PER_NODE": "16(x2)",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NAME": "train.sbatch",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_QOS": "normal",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "ada",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "node[01-02]",
    "SLURM_NPROCS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PRIO_PROCESS": "0",
    "SLURM_SUBMIT_DIR": "/home/ada/run",
    "SLURM_SUBMIT_HOST": "login1",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}

# The batch script itself: step "batch" is not exported, yet PROCID/LOCALID/NODEID are 0.
SLURM_BATCH_SCRIPT = {
    **SLURM_JOB,
    "ENVIRONMENT": "BATCH",
    "SLURMD_NODENAME": "node01",
    "SLURM_GTIDS": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_TASK_PID": "88121",
    "SLURM_TOPOLOGY_ADDR": "node01",
}


def srun_task(procid: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Task ``procid`` of `srun -N2 -n4 python train.py` run from that batch script (step 0)."""
    node = procid // 2
    return {
        **SLURM_BATCH_SCRIPT,
        "SLURMD_NODENAME": f"node0{node + 1}",
        "SLURM_CPU_BIND": "quiet,mask_cpu:0x00FF,0xFF00",
        "SLURM_DISTRIBUTION": "block",
        "SLURM_GTIDS": f"{node * 2},{node * 2 + 1}",
        "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.1",
        "SLURM_LOCALID": str(procid % 2),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(procid),
        "SLURM_SRUN_COMM_HOST": "10.0.0.1",
        "SLURM_SRUN_COMM_PORT": "40123",
        "SLURM_STEPID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_LAUNCHER_PORT": "40123",
        "SLURM_STEP_NODELIST": "node[01-02]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASK_PID": str(90000 + procid),
        "SLURM_TOPOLOGY_ADDR": f"node0{node + 1}",
        **(extra or {}),
    }


# `salloc` with LaunchParameters=use_interactive_step: a shell in the "interactive" pseudo step
# (id 0xFFFFFFFA) with a pty; from a published `env` dump, trimmed.
SALLOC_INTERACTIVE_STEP = {
    **NOISE,
    "SLURMD_NODENAME": "GPUC960",
    "SLURM_CPUS_ON_NODE": "8",
    "SLURM_GTIDS": "0",
    "SLURM_JOBID": "1808417",
    "SLURM_JOB_ID": "1808417",
    "SLURM_JOB_NAME": "1_sh_gpu",
    "SLURM_JOB_NODELIST": "GPUC960",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_LAUNCH_NODE_IPADDR": "172.18.140.10",
    "SLURM_LOCALID": "0",
    "SLURM_MPI_TYPE": "pmix",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "GPUC960",
    "SLURM_PROCID": "0",
    "SLURM_PTY_PORT": "34889",
    "SLURM_PTY_WIN_COL": "236",
    "SLURM_PTY_WIN_ROW": "64",
    "SLURM_SRUN_COMM_HOST": "172.18.140.10",
    "SLURM_SRUN_COMM_PORT": "41771",
    "SLURM_STEPID": "4294967290",
    "SLURM_STEP_ID": "4294967290",
    "SLURM_STEP_LAUNCHER_PORT": "41771",
    "SLURM_STEP_NODELIST": "GPUC960",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "8",
    "SLURM_TASK_PID": "1446865",
}

# `salloc -N2 -n4` without an interactive step: a shell on the login node, no task variables.
SALLOC_SHELL = {
    key: val
    for key, val in SLURM_JOB.items()
    if key not in ("SLURM_SUBMIT_DIR", "SLURM_NTASKS_PER_NODE")
} | {"SLURM_JOB_NAME": "interactive"}

# `srun -N1 -n1 --pty bash` inside that allocation: a real step 3, but a shell on a pty.
SRUN_PTY_SHELL = {
    **srun_task(0),
    "SLURM_STEP_ID": "3",
    "SLURM_STEPID": "3",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NODELIST": "node01",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_NTASKS": "1",
    "SLURM_NPROCS": "1",
    "SLURM_NNODES": "1",
    "SLURM_TASKS_PER_NODE": "1",
    "SLURM_PTY_PORT": "40877",
    "SLURM_PTY_WIN_COL": "120",
    "SLURM_PTY_WIN_ROW": "40",
}


def openmpi_rank(rank: int, size: int = 2, local_size: int = 2) -> dict[str, str]:
    """Rank ``rank`` of Open MPI 4.1 `mpirun -np 2 python x.py` (one host by default)."""
    return {
        **NOISE,
        "OMPI_APP_CTX_NUM_PROCS": str(size),
        "OMPI_ARGV": "x.py",
        "OMPI_COMMAND": "python",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_FIRST_RANKS": "0",
        "OMPI_MCA_ess": "^singleton",
        "OMPI_MCA_ess_base_jobid": "2914451457",
        "OMPI_MCA_ess_base_vpid": str(rank),
        "OMPI_MCA_orte_ess_num_procs": str(size),
        "OMPI_MCA_orte_hnp_uri": "2914451456.0;tcp://10.0.0.1:45131",
        "OMPI_MCA_orte_num_nodes": str(size // local_size),
        "OMPI_MCA_pmix": "^s1,s2,cray,isolated",
        "OMPI_NUM_APP_CTX": "1",
        "OMPI_UNIVERSE_SIZE": str(size),
        "PMIX_NAMESPACE": "2914451457",
        "PMIX_RANK": str(rank),
        "PMIX_SERVER_URI3": "2914451456.0;tcp4://127.0.0.1:49713",
        "PMIX_VERSION": "3.2.3",
    }


def mpich_rank(rank: int) -> dict[str, str]:
    """Rank ``rank`` of MPICH 4 (Hydra) `mpiexec -n 2 python x.py`."""
    return {
        **NOISE,
        "MPI_LOCALNRANKS": "2",
        "MPI_LOCALRANKID": str(rank),
        "PMI_FD": "7",
        "PMI_RANK": str(rank),
        "PMI_SIZE": "2",
    }


def openmpi_in_sbatch(rank: int) -> dict[str, str]:
    """Open MPI `mpirun -np 4 -x MASTER_ADDR=node01` in the batch script above, rank on node02.

    mpirun starts its daemon on node02 with `srun --ntasks-per-node=1 -N1 orted ...`, so ranks
    there inherit that one-task step on top of their MPI variables.
    """
    return {
        **openmpi_rank(rank, size=4, local_size=2),
        **srun_task(0),
        "MASTER_ADDR": "node01",
        "SLURMD_NODENAME": "node02",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NODELIST": "node02",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "1",
    }


def srun_pmi2_task(procid: int) -> dict[str, str]:
    """`srun --mpi=pmi2 -N2 -n4 python x.py`: Slurm's pmi2 plugin adds PMI_RANK/PMI_SIZE."""
    return {
        **srun_task(procid),
        "PMI_FD": "5",
        "PMI_JOBID": "123456.0",
        "PMI_RANK": str(procid),
        "PMI_SIZE": "4",
    }


def srun_torchrun_worker(node: int, local: int) -> dict[str, str]:
    """Worker of `srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 4 ...`."""
    step = srun_task(node * 2)  # one torchrun per node: step task `node` of 2
    step.update(
        {
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(node),
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_NTASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        }
    )
    return {**step, **torchrun_multinode(node, local)}
