"""``agentgym train`` in this process, then this rank's CUDA figures (used by ``test_gpu_smoke.py`` and
``scripts/gpu-smoke.sh``).

``python tests/gpu/gpu_train.py FIGURES_DIR --config X [--set k=v ...]``, alone or as each rank under
``torchrun --nproc_per_node N``: runs the CLI's ``train`` command here (so that the trainer's CUDA allocations
are this process's), then writes ``FIGURES_DIR/rank<RANK>.json`` with the exit code, the wall time and
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` of this rank's device, and exits with the CLI's code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    figures = Path(sys.argv[1])
    argv = sys.argv[2:]
    import torch

    from agentgym.cli import main as cli

    sys.argv = ["agentgym", "train", *argv]
    t0 = time.monotonic()
    code: int = 0
    try:
        cli()
    except SystemExit as e:  # typer ends with sys.exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    rank = int(os.environ.get("RANK", "0"))
    rec: dict[str, object] = {"rank": rank, "exit": code, "wall_s": round(time.monotonic() - t0, 2)}
    if torch.cuda.is_available():
        dev = torch.cuda.current_device()
        rec.update(device=torch.cuda.get_device_name(dev), cuda_index=dev,
                   max_memory_allocated=torch.cuda.max_memory_allocated(dev),
                   max_memory_reserved=torch.cuda.max_memory_reserved(dev))
    figures.mkdir(parents=True, exist_ok=True)
    (figures / f"rank{rank}.json").write_text(json.dumps(rec, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
