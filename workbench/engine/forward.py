"""Forward passes over prompt + completion: per-token log-probs, entropy, values.

Two levers keep them from computing what is not used (issue 20; bench/forward_bench.py):
logits only at completion positions (``logits_to_keep``) with the log-softmax / entropy taken in
row chunks, and the shared-prefix forward (``train.shared_prefix``), which runs each distinct
prompt of a micro-batch once and its G completions against the prompt's cached keys / values.
Both give the plain forward's numbers (tests/engine/test_forward_prefix.py)."""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from workbench.core import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits


def sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Concatenate prompt and completion; position ids follow the attention mask, as in
    ``generate`` with left padding (so trainer and rollout log-probs agree)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    return input_ids, attention_mask, mask_positions(attention_mask)


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows (B, L) -> (B, L): cumsum(mask) - 1, 0 on the padding
    (``generate``'s rule; the trainer, the shared prefix and the generation prefill all use it)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


#: Elements of one chunk of logit rows (16 MiB in fp32) in the row-wise log-softmax / entropy:
#: no (B, L, V) fp32 temporary beside the logits themselves (selective log-softmax, as TRL's
#: selective_log_softmax and verl's chunked entropy).
LOGIT_CHUNK_ELEMENTS = 1 << 22


def _unwrapped(model):
    """The Hugging Face model under the wrappers the engine calls: DDP (``.module``), the LoRA
    reference (``AdapterDisabledReference.policy``) and PEFT (``get_base_model``)."""
    for _ in range(4):
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif not isinstance(model, nn.Module) and hasattr(model, "policy"):
            model = model.policy
        else:
            break
    return model


def _accepts(model, name: str) -> bool:
    """Whether the unwrapped model's forward takes keyword ``name`` (HF causal LMs take
    ``logits_to_keep`` and ``past_key_values``; a custom module may not)."""
    forward = getattr(_unwrapped(model), "forward", None)
    try:
        return forward is not None and name in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _without_ddp(model):
    """``model`` itself, or the module under DDP: the prompt forward of the shared-prefix path
    goes around DDP so that DDP sees one forward per backward (the completion forward); the
    parameters' gradients from both forwards are summed by autograd before DDP's hooks fire."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _checkpointing(module) -> bool:
    """Gradient checkpointing is active: transformers then drops the KV cache (use_cache=False,
    past_key_values=None) in training mode, so the shared-prefix path cannot run."""
    m = _unwrapped(module)
    return bool(m.training and (getattr(m, "is_gradient_checkpointing", False)
                                or any(getattr(x, "gradient_checkpointing", False) for x in m.modules())))


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, keep_only: bool = True) -> torch.Tensor:
    """Logits that predict each completion token, (B, T, V): those at positions P - 1 .. P + T - 2.

    ``keep_only`` (models whose forward takes ``logits_to_keep``): the LM head runs at positions
    P - 1 .. P + T - 2 only, not at all P + T (at P = 111, T = 44 on SmolLM2 the head is ~1/5 of
    the model's FLOPs per position). The decoder sees the same input as the full forward, so the
    kept logits are its numbers exactly (feeding one token less would change the attention
    kernels' shapes and round differently). The positions go in as an index tensor, not a count:
    transformers then gathers the hidden states into a contiguous tensor before the head, whereas
    a count slices them in place, and the head's matmul on that strided view rounded differently
    from one weight tensor to an equal one (a LoRA run's reference, its base with adapters off,
    gave logits 2e-6 off a freshly loaded base). Else: the full forward, sliced."""
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    keep = ({"logits_to_keep": torch.arange(P - 1, P - 1 + T, device=prompt_ids.device)}
            if keep_only and _accepts(model, "logits_to_keep") else {})
    input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **keep).logits
    return logits if keep else logits[:, P - 1 : P - 1 + T]


def prompt_groups(prompt_ids, prompt_mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unique prompt ids (U, P), their masks (U, P), inverse (B,)): row b's prompt is unique row
    inverse[b]. Rows are equal when their ids and masks are, in any order (GRPO's G rows of a
    prompt after the minibatch shuffle)."""
    P = prompt_ids.shape[1]
    rows = torch.cat([prompt_ids.long(), prompt_mask.long()], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    return unique[:, :P].to(prompt_ids.dtype), unique[:, P:].to(prompt_mask.dtype), inverse


Groups = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # prompt_groups: (U, P), (U, P), (B,)


def _shares_prefixes(model, prompt_ids, prompt_mask) -> Groups | None:
    """:func:`prompt_groups` when the shared-prefix forward applies, else None: the plain path
    runs when every prompt is unique (nothing to save), under active gradient checkpointing
    (transformers drops the cache), or for a model whose forward takes no ``past_key_values``."""
    if prompt_ids.shape[0] < 2 or not _accepts(model, "past_key_values") or _checkpointing(model):
        return None
    groups = prompt_groups(prompt_ids, prompt_mask)
    return groups if groups[0].shape[0] < prompt_ids.shape[0] else None


def _prefix_then_completion(call, groups: Groups, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """The shared-prefix forward (Prefix Grouper, 2025): each unique prompt runs once, with the
    KV cache; the cache is indexed to the B rows (index_select: the G rows' gradients flow back
    into their prompt's one computation, summed); the completions then run against it with
    position ids continuing the left-padded prompt's (``sequence_inputs``'s convention).

    ``call(model_kind, **inputs)`` runs the model: ``"prompt"`` (returning the output at the
    prompt's last position and the cache) or ``"completion"``; ``groups``: the batch's
    ``prompt_groups``. Returns (prompt output at its last position indexed to rows, completion
    output over completion positions 0 .. T - 2, or None when T = 1).

    Dropout (LoRA dropout > 0) then draws one mask per prompt, shared by its rows, where the
    plain forward draws one per row: both unbiased, not the same random numbers."""
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    u_ids, u_mask, inverse = groups
    head, cache = call("prompt", input_ids=u_ids, attention_mask=u_mask, position_ids=mask_positions(u_mask), use_cache=True)
    head = head.index_select(0, inverse)
    if T == 1:
        return head, None
    cache.reorder_cache(inverse)  # per layer: keys / values .index_select(0, inverse), in the graph
    _, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids[:, : T - 1], completion_mask[:, : T - 1])
    rest, _ = call("completion", input_ids=completion_ids[:, : T - 1], attention_mask=attention_mask,
                   position_ids=position_ids[:, P:], past_key_values=cache, use_cache=True)
    return head, rest


def shared_prefix_logits(model, groups: Groups, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """``completion_logits`` with each distinct prompt run once (``_prefix_then_completion``).
    Completion token 0 is predicted by the prompt's last position, the others by completion
    positions 0 .. T - 2. -> (B, T, V). Equal to the repeated-prompt forward up to float
    summation order (tests/engine/test_forward_prefix.py: 1e-5 in fp32, gradients too)."""
    completions_run = completion_ids.shape[1] > 1  # else the prompt pass is the only forward

    def call(kind, **inputs):
        # around DDP only when the completion pass follows through DDP: its reducer all-reduces the
        # gradients of both passes; with 1-token completions the prompt pass must go through DDP itself
        m = _without_ddp(model) if kind == "prompt" and completions_run else model
        if kind != "prompt":
            return m(**inputs).logits, None
        last = inputs["input_ids"].shape[1] - 1  # as an index tensor: the head sees a contiguous gather (completion_logits)
        keep = {"logits_to_keep": torch.tensor([last], device=inputs["input_ids"].device)} if _accepts(model, "logits_to_keep") else {}
        out = m(**inputs, **keep)
        return out.logits[:, -1:], out.past_key_values

    head, rest = _prefix_then_completion(call, groups, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return head if rest is None else torch.cat([head, rest], dim=1)


def training_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, shared_prefix: bool = False) -> torch.Tensor:
    """The logits of ``completion_logits`` (B, T, V), through the shared-prefix forward when
    ``shared_prefix`` and it applies (``_shares_prefixes``), else the plain one."""
    groups = _shares_prefixes(model, prompt_ids, prompt_mask) if shared_prefix else None
    if groups is not None:
        return shared_prefix_logits(model, groups, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask)


def by_rows(fn, logits: torch.Tensor, *per_row: torch.Tensor) -> torch.Tensor:
    """``fn`` (a core function of (1, n, V) logits and (1, n) extras -> (1, n)) over chunks of
    rows of logits (B, L, V) -> (B, L): per row the same numbers as ``fn(logits, ...)``.

    The core functions scale and exponentiate a (B, L, V) fp32 copy; chunks bound that to
    LOGIT_CHUNK_ELEMENTS. Under autograd each chunk is checkpointed (recomputed in the backward,
    ~1 % of a step), so no chunk's temporaries are kept for the backward either."""
    B, L, V = logits.shape
    flat = logits.reshape(1, B * L, V)
    extras = [x.reshape(1, B * L) for x in per_row]
    rows = max(1, LOGIT_CHUNK_ELEMENTS // max(V, 1))
    grad = torch.is_grad_enabled() and logits.requires_grad
    out = []
    for s in range(0, B * L, rows):
        args = (flat[:, s : s + rows], *(x[:, s : s + rows] for x in extras))
        out.append(checkpoint(fn, *args, use_reentrant=False) if grad and B * L > rows else fn(*args))
    return torch.cat(out, dim=1).view(B, L)


def logprobs_and_entropy(model, batch, temperature: float, with_entropy: bool = True, entropy_grad: bool = False,
                         shared_prefix: bool = False):
    """Per-token log pi(token) (B, T) and entropy (B, T) (None if not asked; differentiable only
    with ``entropy_grad``, for an entropy bonus). Padding positions hold 0.

    The forward pass covers only the first L = (longest valid completion) positions: completions
    are padded to L_max but usually end far earlier, and with causal attention and padded keys
    masked out, the valid positions' values do not depend on the padding (same values, ~2x less
    compute on short answers). Outputs are padded back to T. ``shared_prefix``: rows that share
    a prompt run it once (``training_logits``; recipe ``train.shared_prefix``).

    ``batch``: anything with prompt_ids, prompt_mask, completion_ids, completion_mask (a Rollout
    or a StepBatch)."""
    T, ids, logits = _valid_logits(model, batch, shared_prefix)
    L = ids.shape[1]
    logp = nn.functional.pad(by_rows(lambda z, i: logprobs_from_logits(z, i, temperature), logits, ids), (0, T - L))
    entropy = None
    if with_entropy or entropy_grad:
        z = logits if entropy_grad else logits.detach()
        entropy = nn.functional.pad(by_rows(lambda x: entropy_from_logits(x, temperature), z), (0, T - L))
    return logp, entropy


def _valid_logits(model, batch, shared_prefix: bool = False) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(T, completion ids (B, L), logits (B, L, V)) over the first L = longest valid completion
    positions (see ``logprobs_and_entropy``)."""
    T = batch.completion_ids.shape[1]
    L = max(1, int(batch.completion_mask.sum(dim=1).max()))
    ids, mask = batch.completion_ids[:, :L], batch.completion_mask[:, :L]
    return T, ids, training_logits(model, batch.prompt_ids, batch.prompt_mask, ids, mask, shared_prefix)


@torch.no_grad()
def logprobs_and_sum_pi_squared(model, batch, temperature: float, shared_prefix: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) (B, T), as ``logprobs_and_entropy``, and sum_v pi_v^2 (B, T) of the
    sampling distribution softmax(logits / temperature) at each position, from the same forward:
    the policy statistics the optimal token baselines weigh paths by. Padding positions hold 0."""
    T, ids, logits = _valid_logits(model, batch, shared_prefix)
    L = ids.shape[1]
    logp = nn.functional.pad(by_rows(lambda z, i: logprobs_from_logits(z, i, temperature), logits, ids), (0, T - L))
    sum_pi_squared = by_rows(lambda z: sum_pi_squared_from_logits(z / temperature), logits) * batch.completion_mask[:, :L].to(logits.dtype)
    return logp, nn.functional.pad(sum_pi_squared, (0, T - L))


class ValueModel(nn.Module):
    """PPO critic: a copy of the policy's backbone with a scalar head (initialised at 0).

    V(s_t) is read at the position *before* completion token t (the state that token is
    chosen in), so values line up with the completion's log-probs.
    """

    def __init__(self, policy: nn.Module, shared_prefix: bool = False) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder() if hasattr(policy, "get_decoder") else policy.model)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.shared_prefix = shared_prefix  # recipe train.shared_prefix: each distinct prompt runs once

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        """Values (B, T), fp32. With ``shared_prefix`` the backbone runs each distinct prompt once
        (``_prefix_then_completion``; V(s_0) is the prompt's last hidden state), falling back to
        the plain forward where that does not apply (``_shares_prefixes``)."""
        groups = _shares_prefixes(self.backbone, prompt_ids, prompt_mask) if self.shared_prefix else None
        if groups is not None:
            def call(kind, **inputs):
                out = self.backbone(**inputs)
                hidden = out.last_hidden_state
                return (hidden[:, -1:] if kind == "prompt" else hidden), out.past_key_values

            first, rest = _prefix_then_completion(call, groups, prompt_ids, prompt_mask, completion_ids, completion_mask)
            hidden = first if rest is None else torch.cat([first, rest], dim=1)
            return self.head(hidden).squeeze(-1).float()
        input_ids, attention_mask, position_ids = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        P, T = prompt_ids.shape[1], completion_ids.shape[1]
        return self.head(hidden[:, P - 1 : P - 1 + T]).squeeze(-1).float()
