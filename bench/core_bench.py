"""Benchmark workbench.core on B=256, T=1024 against naive per-sequence Python references.

Run: .venv/bin/python bench/core_bench.py [--B 256 --T 1024]
Prints, for each function, the vectorised time beside two references run in this same process on
the same data: the equations coded one sequence at a time on tensors (the naive implementation),
and the same loops on plain Python floats (the fastest pure-Python form). The vectorised result is
checked against *both* references before it is timed. One CPU thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench.core import AdvantageConfig, PolicyLossConfig, aggregate_loss, compute_advantages, compute_policy_loss


def times(fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls (the best is the figure; min / median / max its spread)."""
    return [timed(fn)[0] for _ in range(repeats)]


def spread_ms(seconds: list[float]) -> str:
    """min/median/max in ms."""
    return "/".join(f"{x * 1e3:.2f}" for x in (min(seconds), statistics.median(seconds), max(seconds)))


def timed(fn):
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def check_close(name: str, got, references: dict, atol: float, rtol: float) -> None:
    """The vectorised result equals every reference (lists, floats or tensors), in float64."""
    got = torch.as_tensor(got, dtype=torch.float64)
    for label, expected in references.items():
        torch.testing.assert_close(got, torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=rtol,
                                   msg=lambda m, label=label: f"{name}: vectorised != {label} reference\n{m}")


# ---- naive references: one sequence and one token at a time, plain Python floats ----------


def ref_gae(rewards, values, lengths, gamma, lam):
    out = []
    for r, v, n in zip(rewards, values, lengths):
        adv, last = [0.0] * len(v), 0.0
        for t in reversed(range(n)):
            v_next = v[t + 1] if t + 1 < n else 0.0
            delta = (r if t == n - 1 else 0.0) + gamma * v_next - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        out.append(adv)
    return out


def ref_returns(rewards, lengths, gamma):
    out = []
    for r, n in zip(rewards, lengths):
        ret, run = [0.0] * T_GLOBAL, 0.0
        for t in reversed(range(n)):
            run = (r if t == n - 1 else 0.0) + gamma * run
            ret[t] = run
        out.append(ret)
    return out


def ref_aggregate(mode, loss, lengths, max_len):
    seq_sums = [sum(row[:n]) for row, n in zip(loss, lengths)]
    tokens = sum(lengths)
    seqs = sum(1 for n in lengths if n > 0)
    if mode == "token-mean":
        return sum(seq_sums) / tokens
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in zip(seq_sums, lengths) if n > 0) / seqs
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / seqs
    if mode == "seq-mean-token-sum-norm":
        return sum(seq_sums) / (seqs * max_len)
    assert mode == "token-sum-norm", mode
    return sum(seq_sums) / max_len


def ref_clip_loss(logp, old, adv, lengths, eps):
    import math

    out = []
    for lp, o, a, n in zip(logp, old, adv, lengths):
        row = [0.0] * len(lp)
        for t in range(n):
            r = math.exp(lp[t] - o[t])
            row[t] = -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
        out.append(row)
    return out


def ref_grpo(rewards, G, eps):
    out = []
    for i in range(0, len(rewards), G):
        g = rewards[i : i + G]
        m = sum(g) / G
        sd = (sum((x - m) ** 2 for x in g) / (G - 1)) ** 0.5
        out += [(x - m) / (sd + eps) for x in g]
    return out


T_GLOBAL = 0


# ---- naive per-sequence torch references: the equations coded one sequence at a time ---------


def seq_torch_gae(rewards, values, mask, gamma, lam):
    out = torch.zeros_like(values)
    for i in range(values.shape[0]):
        n = int(mask[i].sum())
        last = torch.zeros(())
        for t in reversed(range(n)):
            v_next = values[i, t + 1] if t + 1 < n else 0.0
            delta = (rewards[i] if t == n - 1 else 0.0) + gamma * v_next - values[i, t]
            last = delta + gamma * lam * last
            out[i, t] = last
    return out


def seq_torch_returns(rewards, mask, gamma):
    out = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        run = torch.zeros(())
        for t in reversed(range(n)):
            run = (rewards[i] if t == n - 1 else 0.0) + gamma * run
            out[i, t] = run
    return out


def seq_torch_aggregate(mode, loss, mask, max_len):
    total, per_seq, tokens, seqs = 0.0, 0.0, 0.0, 0
    for i in range(loss.shape[0]):
        n = int(mask[i].sum())
        s = loss[i, :n].sum()
        total, tokens, seqs = total + s, tokens + n, seqs + (n > 0)
        per_seq = per_seq + (s / n if n else 0.0)
    return {"token-mean": total / tokens, "seq-mean-token-mean": per_seq / seqs,
            "seq-mean-token-sum": total / seqs, "seq-mean-token-sum-norm": total / (seqs * max_len),
            "token-sum-norm": total / max_len}[mode]


def seq_torch_clip_loss(logp, old, adv, mask, eps):
    out = torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        r = torch.exp(logp[i, :n] - old[i, :n])
        out[i, :n] = -torch.minimum(r * adv[i, :n], r.clamp(1 - eps, 1 + eps) * adv[i, :n])
    return out


def seq_torch_grpo(rewards, G, eps):
    out = torch.zeros_like(rewards)
    for i in range(0, rewards.shape[0], G):
        g = rewards[i : i + G]
        out[i : i + G] = (g - g.mean()) / (g.std() + eps)
    return out


def main() -> None:
    global T_GLOBAL
    parser = argparse.ArgumentParser()
    parser.add_argument("--B", type=int, default=256)
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    B, T = args.B, args.T
    T_GLOBAL = T
    g = torch.Generator().manual_seed(0)
    lengths_t = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths_t[:, None]).float()
    rewards = torch.randn(B, generator=g)
    values = torch.randn(B, T, generator=g)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + 0.1 * torch.randn(B, T, generator=g)
    loss = torch.randn(B, T, generator=g)
    lengths = lengths_t.tolist()
    L = dict(rewards=rewards.tolist(), values=values.tolist(), logp=logp.tolist(), old=old.tolist(), loss=loss.tolist())

    rows = []

    def bench(name, vec, ref, seq_ref, pick=lambda out: out, atol=1e-4, rtol=1e-4):
        """Check pick(vec()) against both references, then time all three (the per-seq torch
        reference once: its checked result is the one it was timed producing)."""
        ts, seq_out = timed(seq_ref)
        check_close(name, pick(vec()), {"pure Python": ref(), "per-seq torch": seq_out}, atol, rtol)
        tvs, trs = times(vec, args.repeats), times(ref, max(1, args.repeats // 2))
        tv, tr = min(tvs), min(trs)
        rows.append((name, tv * 1e3, ts * 1e3, ts / tv, tr * 1e3, tr / tv, spread_ms(tvs), spread_ms(trs)))

    gae_cfg = AdvantageConfig(gamma=0.99, lam=0.95)
    gae_vec = lambda: compute_advantages("gae", rewards, mask, gae_cfg, values=values)  # noqa: E731
    gae_ref = lambda: ref_gae(L["rewards"], L["values"], lengths, 0.99, 0.95)  # noqa: E731
    bench("gae (gamma .99, lambda .95)", gae_vec, gae_ref, lambda: seq_torch_gae(rewards, values, mask, 0.99, 0.95),
          pick=lambda out: out.advantages, atol=1e-3)

    pp_cfg = AdvantageConfig(gamma=0.99)
    pp_vec = lambda: compute_advantages("reinforce_pp", rewards, mask, pp_cfg)  # noqa: E731
    pp_ref = lambda: ref_returns(L["rewards"], lengths, 0.99)  # noqa: E731
    bench("reinforce_pp (returns + whiten)", pp_vec, pp_ref, lambda: seq_torch_returns(rewards, mask, 0.99),
          pick=lambda out: out.returns)

    G = 8
    grpo_vec = lambda: compute_advantages("grpo", rewards, mask, AdvantageConfig(group_size=G))  # noqa: E731
    grpo_ref = lambda: ref_grpo(L["rewards"], G, 1e-6)  # noqa: E731
    bench("grpo advantages (G=8)", grpo_vec, grpo_ref, lambda: seq_torch_grpo(rewards, G, 1e-6),
          pick=lambda out: out.advantages[:, 0])

    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum-norm"):
        vec = lambda mode=mode: aggregate_loss(mode, loss, mask, max_len=T)  # noqa: E731
        ref = lambda mode=mode: ref_aggregate(mode, L["loss"], lengths, T)  # noqa: E731
        bench(f"aggregate {mode}", vec, ref, lambda mode=mode: seq_torch_aggregate(mode, loss, mask, T), atol=1e-3)

    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous() * mask
    clip_vec = lambda: compute_policy_loss("clip", logp, old, adv, mask, PolicyLossConfig())  # noqa: E731
    adv_l = adv.tolist()
    clip_ref = lambda: ref_clip_loss(L["logp"], L["old"], [row[0] for row in adv_l], lengths, 0.2)  # noqa: E731
    bench("policy loss clip (+ diagnostics)", clip_vec, clip_ref, lambda: seq_torch_clip_loss(logp, old, adv, mask, 0.2),
          pick=lambda out: out[0])

    print(f"workbench.core on B={B} T={T}, 1 thread (best of {args.repeats}; pure Python best of {max(1, args.repeats // 2)}, "
          "per-seq torch timed once); references on the same data:")
    print("  per-seq torch = the equations coded one sequence (and, for recurrences, one token) at a time on tensors")
    print("  pure Python   = the same loops on Python floats, lists converted beforehand (conversion not timed)")
    print("  spread: min/median/max ms of the repeats of the vectorised and the pure Python timings")
    print(f"{'function':36s} {'vectorised ms':>13s} {'per-seq torch ms':>17s} {'speed-up':>9s} {'pure Python ms':>15s} {'speed-up':>9s}"
          f"  {'vectorised spread':>20s} {'pure Python spread':>24s}")
    for name, tv, ts, rs, tr, rr, sv, sr in rows:
        print(f"{name:36s} {tv:13.2f} {ts:17.1f} {rs:8.0f}x {tr:15.1f} {rr:8.1f}x  {sv:>20s} {sr:>24s}")

if __name__ == "__main__":
    main()
