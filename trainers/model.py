"""The trained model: loading (full or LoRA through ``peft``), adapters, and token log-probabilities."""

from __future__ import annotations

from typing import Any

import torch

from agentgym.errors import ConfigurationError, DependencyNotInstalled

from .batching import MicroBatch

__all__ = ["DTYPES", "adapter_parameters", "add_lora", "load_causal_lm", "token_logprobs"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_causal_lm(path: str, dtype: str = "float32", device: str = "cpu", gradient_checkpointing: bool = False) -> Any:
    """A transformers causal LM in train mode (``path``: short name, folder or hub id)."""
    try:
        import transformers
    except ImportError as e:
        raise DependencyNotInstalled("training", "agentgym[hf]") from e
    from agentgym.policies.models import resolve_model

    resolved = resolve_model(path)
    try:
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(resolved, dtype=DTYPES[dtype])
    except OSError as e:
        raise ConfigurationError(f"cannot load model {path!r} from {resolved}: {e}") from e
    model = model.to(device)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model


def add_lora(model: Any, adapter: str, *, rank: int, alpha: float, dropout: float, targets: list[str] | str) -> Any:
    """Wrap ``model`` with a LoRA adapter named ``adapter`` (or add one to an existing peft model)."""
    try:
        import peft
    except ImportError as e:
        raise DependencyNotInstalled("LoRA fine-tuning", "agentgym[train]", "It brings peft.") from e
    lora_kw: dict[str, Any] = {"r": rank, "lora_alpha": alpha, "lora_dropout": dropout, "target_modules": targets,
                               "task_type": "CAUSAL_LM", "bias": "none"}
    cfg = peft.LoraConfig(**lora_kw)
    if isinstance(model, peft.PeftModel):
        model.add_adapter(adapter, cfg)
        return model
    return peft.get_peft_model(model, cfg, adapter_name=adapter)


def adapter_parameters(model: Any, adapter: str | None) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters one trainer optimizes: one LoRA adapter's, or every parameter (full fine-tune)."""
    if adapter is None:
        return [(n, p) for n, p in model.named_parameters()]
    params = [(n, p) for n, p in model.named_parameters() if f".{adapter}." in n and "lora_" in n]
    if not params:
        raise ConfigurationError(f"the model has no LoRA adapter {adapter!r}")
    return params


def token_logprobs(model: Any, mb: MicroBatch, *, entropy: bool = False,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every next token, and optionally the entropy on trained positions.

    Returns:
        ``logp`` ``[B, W-1]`` float32 (position t: log p(token t+1 | tokens <= t)), with grad if the
        model is in grad mode; ``entropy`` ``[B, W-1]`` (0 off the target mask; with grad only if
        ``entropy_grad``) or ``None``.
    """
    b, w = mb.input_ids.shape
    keep = (mb.target_mask.sum(0) > 0).nonzero().reshape(-1)  # [K] positions some row trains on
    if keep.numel() == 0:
        keep = torch.arange(w - 1, device=mb.input_ids.device)
    # the LM head (and the fp32 log-softmax over the vocabulary) runs only where a target is trained:
    # prompt and tool tokens never pay for it
    out = model(**mb.model_inputs(), use_cache=False, logits_to_keep=keep)
    logits = out.logits.float()  # [B, K, V]
    targets = mb.input_ids[:, keep + 1].unsqueeze(-1)  # [B, K, 1]
    kept = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [B, K]
    logp = torch.zeros((b, w - 1), dtype=kept.dtype, device=kept.device).index_copy(1, keep, kept)  # [B, W-1]
    ent = None
    if entropy or entropy_grad:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            sel = mb.target_mask[:, keep] > 0  # [B, K]
            z = logits[sel] if entropy_grad else logits.detach()[sel]  # [N, V]
            p = torch.softmax(z, dim=-1)
            h = torch.logsumexp(z, dim=-1) - (p * z).sum(-1)  # [N]
            ek = torch.zeros_like(kept).masked_scatter(sel, h)  # [B, K]
            ent = torch.zeros((b, w - 1), dtype=ek.dtype, device=ek.device).index_copy(1, keep, ek)
    return logp, ent
