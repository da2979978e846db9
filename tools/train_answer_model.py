"""Train ``answer-qwen3``: a small Qwen3 that adds two 3-digit numbers, deterministically, on CPU.

    .venv/bin/python tools/train_answer_model.py --out tasks/models/shipped/answer-qwen3

The task (token ids, vocabulary :data:`VOCAB_SIZE` = 16)::

    0 <pad>   1 <bos>   2 <eos>   3 "+"   4 "="   5..14 the digits 0..9   (15 unused)

    prompt  = <bos> a0 a1 a2 "+" b0 b1 b2 "="        (9 tokens, digits least significant first)
    answer  = s0 s1 s2 s3 <eos>                      (5 tokens, s = a + b, least significant first)

``a`` and ``b`` are 0..999 written with three digits (zero-padded), the sum with four; digits are
reversed (units first) so that each answer digit depends on the digits already seen and a carry,
which a 2-layer model learns in a few hundred steps.  The 10^6 (a, b) pairs are split once by a seeded
permutation: the first :data:`TEST_SIZE` are the held-out test set, never drawn for training.

Training is deterministic: ``torch.use_deterministic_algorithms(True)``, ``--threads`` intra-op
threads (1 by default; recorded), a seeded ``torch.Generator`` for the weights and for every batch,
AdamW with warmup + cosine decay, float32, loss on the 5 answer tokens only.  The checkpoint
directory gets ``config.json``, ``model.safetensors`` (float32; the engine quantizes it to W8A8 on
load) and ``MANIFEST.json`` (the sha256 of ``model.safetensors``, this command, the torch and
transformers versions, the CPU identity, seed, steps, final loss and the held-out accuracy of the
float model and of the W8A8 engine with exact Clopper-Pearson intervals).  With ``--demo-prompts``
it also writes a JSONL of held-out prompts with their answers (``{"tokens": [...], "answer": [...]}``).

Retraining with the same command on the same CPU kind and thread count gives the same sha256
(tests/test_answer_model_train.py, slow).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5  #: token id of the digit 0; digit d is DIGIT0 + d
VOCAB_SIZE = 16
DIGITS = 3  #: digits of each operand
PROMPT_LEN = 1 + DIGITS + 1 + DIGITS + 1
ANSWER_LEN = DIGITS + 1 + 1  #: the sum's digits and <eos>
TEST_SIZE = 5000

#: The model (transformers ``Qwen3Config`` keyword arguments): GQA like ``tiny-qwen3`` (4 query
#: heads, 2 KV heads, head_dim 32, hidden 128), 2 decoder layers = 14 W8A8 layers.
CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "use_sliding_window": False,
}


def encode_prompt(a: int, b: int) -> list[int]:
    """The prompt tokens of ``a + b`` (module docstring)."""
    if not (0 <= a < 10**DIGITS and 0 <= b < 10**DIGITS):
        raise ValueError(f"operands must be in [0, {10**DIGITS}); got {a}, {b}")
    def rev(n: int) -> list[int]:
        return [DIGIT0 + int(c) for c in reversed(str(n).zfill(DIGITS))]

    return [BOS, *rev(a), PLUS, *rev(b), EQUALS]


def encode_answer(a: int, b: int) -> list[int]:
    """The expected continuation of :func:`encode_prompt` ``(a, b)``: the sum's digits reversed, <eos>."""
    return [DIGIT0 + int(c) for c in reversed(str(a + b).zfill(DIGITS + 1))] + [EOS]


def decode_answer(tokens: list[int]) -> int | None:
    """The integer an answer's digit tokens spell (units first), or None if it is not 4 digits + <eos>."""
    if len(tokens) != ANSWER_LEN or tokens[-1] != EOS or not all(DIGIT0 <= t < DIGIT0 + 10 for t in tokens[:-1]):
        return None
    return int("".join(str(t - DIGIT0) for t in reversed(tokens[:-1])))


def split_pairs(seed: int) -> tuple[Any, Any]:
    """(test pair indices, train pair indices) of the 10^6 pairs ``index = a * 1000 + b``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(10 ** (2 * DIGITS), generator=g)
    return perm[:TEST_SIZE].sort().values, perm[TEST_SIZE:]


def batch_tokens(pairs: Any) -> Any:
    """``[n, PROMPT_LEN + ANSWER_LEN]`` int64 sequences for pair indices ``a * 1000 + b`` (vectorised)."""
    import torch

    a, b = pairs // 10**DIGITS, pairs % 10**DIGITS
    s = a + b

    def digits(n: Any, width: int) -> Any:  # units first
        return torch.stack([(n // 10**i) % 10 for i in range(width)], dim=1) + DIGIT0

    def col(v: int) -> Any:
        return torch.full((len(pairs), 1), v, dtype=torch.long)

    return torch.cat([col(BOS), digits(a, DIGITS), col(PLUS), digits(b, DIGITS), col(EQUALS),
                      digits(s, DIGITS + 1), col(EOS)], dim=1)


def float_accuracy(model: Any, pairs: Any) -> int:
    """Greedy answers of the float model (fixed width, no padding): how many are exactly right."""
    import torch

    seqs = batch_tokens(pairs)
    ids = seqs[:, :PROMPT_LEN]
    with torch.inference_mode():
        for _ in range(ANSWER_LEN):
            nxt = model(input_ids=ids).logits[:, -1, :].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return int((ids[:, PROMPT_LEN:] == seqs[:, PROMPT_LEN:]).all(dim=1).sum())


def engine_answers(out: Path, pairs: Any, kernel: str) -> list[list[int]]:
    """Greedy answers (``ANSWER_LEN`` tokens each) of the W8A8 engine (``build_model(out)``)."""
    from tasks.models import build_model

    model = build_model(str(out), kernel=kernel)
    seqs = batch_tokens(pairs)
    answers: list[list[int]] = []
    for lo in range(0, len(pairs), 1000):
        gen = model.generate(seqs[lo:lo + 1000, :PROMPT_LEN].tolist(), ANSWER_LEN)
        answers += [list(t) for t in gen.tokens]
    return answers


def engine_accuracy(out: Path, pairs: Any, kernel: str) -> int:
    """Greedy answers of the W8A8 engine (``build_model(out)``): how many are exactly right."""
    want = batch_tokens(pairs)[:, PROMPT_LEN:].tolist()
    return sum(t == w for t, w in zip(engine_answers(out, pairs, kernel), want, strict=True))


def swap_comparison(out: Path, pairs: Any, kernels: tuple[str, str]) -> dict[str, Any]:
    """Both kernels' greedy answers on the same prompts, paired: right under each, answers that differ,
    a_only (right under the first kernel only), b_only, and the exact McNemar test (scipy's two-sided
    binomial test of b_only among the a_only + b_only discordant prompts, p = 0.5)."""
    from scipy.stats import binomtest

    want = batch_tokens(pairs)[:, PROMPT_LEN:].tolist()
    got = [engine_answers(out, pairs, k) for k in kernels]
    ok = [[t == w for t, w in zip(g, want, strict=True)] for g in got]
    a_only = sum(1 for x, y in zip(*ok, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(*ok, strict=True) if y and not x)
    return {"kernels": list(kernels), "n": len(want), "right": [sum(o) for o in ok],
            "answers_differ": sum(1 for x, y in zip(*got, strict=True) if x != y),
            "a_only": a_only, "b_only": b_only, "change": (b_only - a_only) / len(want),
            "mcnemar_exact_p": (float(binomtest(b_only, a_only + b_only, 0.5).pvalue) if a_only + b_only else None),
            "unit": "held-out prompts, greedy, each kernel once (a_only: right under the first kernel only)"}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of k successes in n trials (scipy)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def cpu_identity(threads: int) -> dict[str, Any]:
    """What the trained bits may depend on: CPU model, the ISA flags oneDNN/MKL dispatch on, torch's
    CPU capability, thread count."""
    import torch

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "vendor_id", "cpu family", "model", "stepping", "flags") and key not in info:
                info[key] = value.strip()
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
    flags = set(info.pop("flags", "").split())
    return {
        "model_name": info.get("model name", platform.processor() or "unknown"),
        "vendor_id": info.get("vendor_id"),
        "cpu_family": info.get("cpu family"),
        "cpu_model": info.get("model"),
        "stepping": info.get("stepping"),
        "machine": platform.machine(),
        "isa_flags": [f for f in wanted if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)  # transformers' own init reads the global RNG
    test_pairs, train_pairs = split_pairs(args.seed)
    config = Qwen3Config(**CONFIG)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, int(args.steps) // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return float(args.lr) * (step + 1) / warmup
        return float(args.lr) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    g = torch.Generator().manual_seed(args.seed + 1)
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, len(train_pairs), (args.batch,), generator=g)
        seqs = batch_tokens(train_pairs[idx])
        labels = seqs.clone()
        labels[:, :PROMPT_LEN] = -100  # loss on the answer tokens only
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=seqs, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if args.log_every and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {losses[-1]:.5f}  lr {lr_at(step):.2e}  {time.perf_counter() - t0:6.1f} s",
                  flush=True)
    train_s = time.perf_counter() - t0
    model.eval()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in sorted(model.state_dict().items())}
    weights = out / "model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    cfg = config.to_dict()
    for key in ("transformers_version", "_name_or_path", "_attn_implementation_autoset", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()

    n = len(test_pairs)
    if args.no_eval:  # the weights only (the retraining test compares the hash; the accuracy has its own test)
        float_right, engine_right, swap = None, {}, None
    else:
        float_right = float_accuracy(model, test_pairs)
        swap = swap_comparison(out, test_pairs, ("int8-cutlass-order", "int8-triton-order"))
        engine_right = dict(zip(swap["kernels"], swap["right"], strict=True))

    def acc(k: int) -> dict[str, Any]:
        lo, hi = clopper_pearson(k, n)
        return {"correct": k, "n": n, "accuracy": k / n, "ci95": [lo, hi], "method": "Clopper-Pearson exact, 95%",
                "unit": "held-out prompts, answer exactly right (4 digits + <eos>, greedy)"}

    manifest = {
        "format": "swapcheck-answer-model",
        "version": 1,
        "name": args.name,
        "model_safetensors_sha256": sha,
        "command": "python tools/train_answer_model.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu_identity(args.threads),
        "deterministic_algorithms": True,
        "seed": args.seed,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "optimizer": "AdamW(betas=(0.9, 0.98), weight_decay=0.01), linear warmup 5% + cosine, grad-norm clip 1.0",
        "parameters": n_params,
        "final_loss": losses[-1],
        "final_loss_mean_last_50": sum(losses[-50:]) / len(losses[-50:]),
        "train_seconds": round(train_s, 1),
        "task": {
            "tokens": {"pad": PAD, "bos": BOS, "eos": EOS, "+": PLUS, "=": EQUALS, "digits": f"{DIGIT0}..{DIGIT0 + 9}"},
            "prompt": "<bos> a0 a1 a2 + b0 b1 b2 =  (digits units first, zero-padded)",
            "answer": "s0 s1 s2 s3 <eos>  (s = a + b, units first)",
            "test_set": f"the first {TEST_SIZE} of torch.randperm(10**6, seed) of index a*1000+b; never trained on",
        },
        "held_out": ("not evaluated (--no-eval)" if float_right is None else
                     {"float32": acc(float_right), **{f"w8a8 {k}": acc(v) for k, v in engine_right.items()}}),
    }
    if swap is not None:
        manifest["held_out_swap"] = swap
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if args.demo_prompts:
        demo = Path(args.demo_prompts)
        demo.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for p in test_pairs[: args.demo_count].tolist():
            a, b = divmod(p, 10**DIGITS)
            lines.append(json.dumps({"tokens": encode_prompt(a, b), "answer": encode_answer(a, b), "text": f"{a}+{b}={a + b}"}))
        demo.write_text("\n".join(lines) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", default="tasks/models/shipped/answer-qwen3", help="checkpoint directory to write")
    ap.add_argument("--name", default="answer-qwen3", help="the model's name in MANIFEST.json (its models/ directory)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (recorded; part of the identity)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--demo-prompts", default=None, help="also write this JSONL of held-out prompts with answers")
    ap.add_argument("--demo-count", type=int, default=256)
    ap.add_argument("--no-eval", action="store_true",
                    help="skip the held-out evaluation (the weights and their hash are the same)")
    args = ap.parse_args(argv)
    m = train(args)
    print(json.dumps({k: m.get(k) for k in ("model_safetensors_sha256", "final_loss", "train_seconds", "held_out",
                                           "held_out_swap")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
