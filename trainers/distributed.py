"""Sharded data-parallel training: ``torch.distributed`` ranks and FSDP2 (``trainer.strategy = "fsdp2"``).

Everything here is PyTorch's own: the process group (gloo on CPU, nccl on CUDA) that ``torchrun`` sets up
through ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``, ``fully_shard`` with
``MixedPrecisionPolicy`` and ``CPUOffloadPolicy``, and ``torch.distributed.checkpoint.state_dict`` to
gather the full weights for ``final/``.

**The step N ranks take is the step one process takes on the whole batch.** Each rank trains on its share
of the batch (:meth:`Ranks.share`); the loss normalisers of :func:`~agentgym.trainers.losses.aggregation_weights`
(sequences and masked tokens) are summed over the ranks before any weight is computed, so every token
carries the weight it has in the one-process batch; FSDP's gradient reduction then *sums* the ranks'
gradients (its default divides by the world size, which would be a mean of per-rank means). A per-rank
normaliser is the classic bug of sharded RL trainers; ``tests/trainers/test_fsdp.py`` compares the
parameters of 2 ranks with one process after 3 optimizer steps.

Collectives need every rank in step: a rank with fewer micro-batches than another pads with zero-weight
micro-batches (forward and backward run, nothing is learned from them), and a non-finite loss or gradient
norm is decided on the global gradient norm, so every rank skips the same step.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from agentgym.errors import ConfigurationError

__all__ = ["QuietLogger", "Ranks", "broadcast_bytes", "close_ranks", "full_state", "gather_trainable",
           "gathered_trainer", "init_ranks", "launched", "load_full", "load_sharded", "local_value", "save_sharded",
           "shard_model"]

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the trainer's process group.

    Attributes:
        rank / world: This rank and the number of ranks.
        local_rank: The rank on this machine (its GPU index on CUDA).
        device: Where this rank computes (``cpu`` or ``cuda:LOCAL_RANK``).
    """

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes logs, metrics, checkpoint metadata and ``final/``."""
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's share of a global batch (every ``world``-th item from ``rank``)."""
        return list(items[self.rank::self.world])

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64,
                         device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=op)
        return [float(v) for v in t.tolist()]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over the ranks."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over the ranks."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def barrier(self) -> None:
        dist.barrier()

    @property
    def comm_device(self) -> torch.device:
        """Where collectives' tensors live: this rank's GPU under nccl, the CPU under gloo."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def broadcast_bytes(ranks: Ranks, data: bytes | None) -> bytes:
    """Rank 0's ``data`` on every rank (a collective: its length, then its bytes, as ``uint8`` tensors through
    ``torch.distributed.broadcast``; nothing is pickled). Other ranks pass ``None``."""
    dev = ranks.comm_device
    n = torch.tensor([len(data) if ranks.is_main and data is not None else 0], dtype=torch.int64, device=dev)
    dist.broadcast(n, src=0)
    size = int(n.item())
    if size == 0:
        return b""
    if ranks.is_main:
        assert data is not None
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    else:
        buf = torch.empty(size, dtype=torch.uint8, device=dev)
    dist.broadcast(buf, src=0)
    return data if ranks.is_main and data is not None else buf.cpu().numpy().tobytes()


def launched() -> bool:
    """Whether a launcher (``torchrun``) started this process as one rank of a group."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_ranks(device: str = "cpu", timeout_s: float = 1800.0) -> Ranks:
    """Join (or create) the default process group from the launcher's environment: nccl for ``cuda``, gloo
    otherwise. Without a launcher this is a group of one (rank 0 of 1, on a free local port)."""
    if not launched():
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise ConfigurationError("model.device = 'cuda' but CUDA is not available on this rank")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        # on CUDA, gloo too for the CPU tensors collectives may meet (CPU-offloaded shards and their gradients)
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return Ranks(dist.get_rank(), dist.get_world_size(), local, dev)


def close_ranks() -> None:
    """Leave the process group (every rank calls this once, at the end of the run)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks (transformers' ``_no_split_modules``), each its own FSDP unit."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigurationError(f"{type(model).__name__}: no decoder layers to shard (no _no_split_modules)")
    return layers


def shard_model(model: Any, ranks: Ranks, *, mixed_precision: str | None = None, cpu_offload: bool = False,
                activation_checkpointing: bool = False, frozen: bool = False) -> Any:
    """Shard ``model`` (a transformers causal LM, or a peft model over one) in place with FSDP2.

    Every decoder layer is one FSDP unit and the root holds the rest (embeddings, final norm, LM head).
    ``mixed_precision`` (``"bfloat16"``): compute in bf16, reduce gradients in fp32, keep fp32 shards.
    Gradients are summed over the ranks (see the module docstring). Call it after LoRA adapters are added
    and before the optimizer is built (the parameters become ``DTensor`` shards).

    ``frozen``: a model that only runs forward without grad (the KL reference): the root reshards after every
    forward too (by default it keeps its parameters gathered for the backward that follows, which never comes).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    mesh = init_device_mesh(ranks.device.type, (ranks.world,))
    dtype = {"bfloat16": torch.bfloat16}.get(mixed_precision or "")
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)
    offload: OffloadPolicy = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    root: dict[str, Any] = {"reshard_after_forward": True} if frozen else {}
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload, **root)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum, not mean: the loss weights are already global
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    return model


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """The whole model's state dict gathered on rank 0 (CPU tensors, the unsharded names); other ranks get an
    empty dict. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state


def gather_trainable(trainer: Any) -> dict[str, torch.Tensor]:
    """The parameters a sharded trainer optimizes (``trainer.params``: every parameter for a full fine-tune, the
    adapter's LoRA tensors only for LoRA), gathered whole on rank 0 as CPU tensors under their unsharded names;
    other ranks get an empty dict. A collective: every rank calls it, in the same (parameter) order."""
    ranks: Ranks = trainer.ranks
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in trainer.params:
            t = p.detach()
            if hasattr(t, "full_tensor"):
                if t.device != ranks.comm_device:  # cpu_offload: the shard lives on the host, nccl gathers on the GPU
                    t = t.to(ranks.comm_device)
                t = t.full_tensor()
            if ranks.is_main:
                out[name] = t.to("cpu", copy=True)
    return out


def local_value(t: Any) -> float:
    """A scalar that may be a ``DTensor`` (a gradient norm over shards) as a float: the full value."""
    full = getattr(t, "full_tensor", None)
    return float(full() if full is not None else t)


# ---------------------------------------------------------------------- sharded checkpoints (DCP)
def save_sharded(path: str | Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Write the model's and the optimizer's state to the folder ``path`` with ``torch.distributed.checkpoint``:
    each rank writes its own shards (a collective when a process group is up; one process writes it all
    otherwise). The keys are the unsharded parameter names, so any world size reads it back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, [optimizer])
    dcp.save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(str(path)))


def load_sharded(path: str | Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Read a :func:`save_sharded` folder into ``model`` and ``optimizer`` (sharded or not, any world size).
    The folder's metadata is unpickled with an allowlist of checkpoint types only: nothing in it runs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    reader = _SafeReader(str(path))
    reader.read_metadata()  # a refusal surfaces here as itself, not wrapped by DCP's collective error handling
    msd, osd = get_state_dict(model, [optimizer])
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=reader)  # in place, into the tensors of msd and osd
    set_state_dict(model, [optimizer], model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_full(model: Any, optimizer: torch.optim.Optimizer, names: Sequence[str], weights: dict[str, torch.Tensor],
              optim_state: dict[str, Any]) -> None:
    """A one-process checkpoint into a sharded model (1 -> N ranks): every rank takes its shards of the full
    ``weights`` (the trained parameters, by name) and of ``optim_state`` (``optimizer.state_dict()`` of one
    process, whose parameter ids follow ``names``)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, strict=False)  # LoRA: the adapter's tensors only
    set_model_state_dict(model, dict(weights), options=opts)
    ids = [i for g in optim_state["param_groups"] for i in g["params"]]
    if len(ids) != len(names):
        raise ConfigurationError(f"the checkpoint's optimizer has {len(ids)} parameters, this trainer {len(names)}")
    by_id = dict(zip(ids, names, strict=True))
    osd: dict[str, Any] = {
        "state": {by_id[int(i)]: st for i, st in optim_state["state"].items()},
        "param_groups": [{**g, "params": [by_id[i] for i in g["params"]]} for g in optim_state["param_groups"]]}
    set_optimizer_state_dict(model, [optimizer], osd, options=opts)


def _safe_reader_class() -> type:
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    allowed_modules = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner")
    allowed = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
               ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("torch", "Size"),
               ("collections", "OrderedDict")}
    dtypes = {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            ok = module in allowed_modules or (module, name) in allowed or (module == "torch" and name in dtypes)
            if not ok:
                raise pickle.UnpicklingError(f"refusing {module}.{name} in a checkpoint's metadata")
            return super().find_class(module, name)

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            try:
                with self.fs.create_stream(path, "rb") as f:
                    metadata = _Unpickler(f).load()
            except FileNotFoundError:
                raise ConfigurationError(f"{self.path} is not a complete sharded checkpoint (no {path}); delete it "
                                         "or set run.resume = false") from None
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
                raise ConfigurationError(f"refusing to load {self.path}: its metadata holds something other than "
                                         f"checkpoint metadata; nothing in it was run ({e})") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


def _SafeReader(path: str) -> Any:
    return _safe_reader_class()(path)


# ---------------------------------------------------------------------- what rank 0 alone does
def gathered_trainer(trainer: Any, path: str, dtype: str, lora: dict[str, Any] | None, into: Any = None,
                     trainable_only: bool = False) -> Any:
    """A one-process copy of a sharded trainer's model, for evaluation and ``final/`` (a collective; ``None``
    except on rank 0).

    Rank 0 loads the model from ``path`` on the CPU (with the trainer's LoRA adapter, ``lora``: add_lora's
    settings), or reuses ``into`` (an earlier copy), and loads the gathered full state into it. Returns an object
    with ``model`` and ``adapter``, which :meth:`~agentgym.trainers.run.RunFolder.save_final` and
    :func:`~agentgym.trainers.publish.trainable_state` take like a trainer's.

    ``trainable_only``: gather only what the trainer optimizes (:func:`gather_trainable`: the adapter's tensors
    for LoRA) into the copy, whose other tensors are the frozen ones loaded from ``path``.
    """
    from types import SimpleNamespace

    from .model import add_lora, load_causal_lm

    state = gather_trainable(trainer) if trainable_only else full_state(trainer.model)
    if trainer.ranks is not None and not trainer.ranks.is_main:
        return None
    if into is None:
        plain = load_causal_lm(path, dtype, "cpu")
        if trainer.adapter is not None:
            plain = add_lora(plain, trainer.adapter, **(lora or {}))
        into = SimpleNamespace(model=plain, adapter=trainer.adapter)
    if trainable_only:
        with torch.no_grad():
            mine = dict(into.model.named_parameters())
            missing = set(state) - set(mine)
            if missing:
                raise ConfigurationError(f"the gathered copy lacks {sorted(missing)[:3]}")
            for n, t in state.items():
                mine[n].copy_(t.to(mine[n].dtype))
    else:
        into.model.load_state_dict(state)
    return into


class QuietLogger:
    """The metrics logger of ranks other than 0: they train in step with rank 0 and write nothing."""

    def note(self, msg: str) -> None:
        pass

    def log(self, step: int, rec: dict[str, Any]) -> dict[str, Any]:
        return rec

    def close(self) -> None:
        pass
