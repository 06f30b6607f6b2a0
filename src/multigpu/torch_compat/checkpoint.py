"""DCP metadata unpickling: the globals a ``.metadata`` file written by torch names (see
``multigpu.torch_compat``)."""

from __future__ import annotations

import torch

DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    }
)
"""The (module, name) globals a DCP ``.metadata`` pickle may name, besides torch dtypes."""


def dcp_metadata_global_allowed(module: str, name: str) -> bool:
    """Whether a DCP metadata pickle may load the global ``module.name`` (dtypes included)."""
    if (module, name) in DCP_METADATA_GLOBALS:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
