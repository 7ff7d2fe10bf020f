"""Figures of the foundation issue on this machine (a benchmark that prints numbers, not a test).

1. BERT-base classifier train step (forward, backward, AdamW), batch 8, seq 128, fp32: bertbench's baseline vs HF
   transformers' BertForSequenceClassification with the same weights, interleaved in one run; achieved FLOP/s as a
   share of the machine's measured fp32 matmul FLOP/s.
2. Seq 512: saved-for-backward bytes and step time of each recompute policy relative to the baseline.

    python benchmarks/foundation.py                  # BERT-base, as in the issue (about 10 minutes on 2 cores)
    python benchmarks/foundation.py --layers 2 --hidden 128 --repeats 2   # quick look
Writes JSON with --output. Needs `transformers` (the test extra) for the HF comparison.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bertbench.bench import measure
from bertbench.bench.output import machine, markdown_table, write_report
from bertbench.config import BertConfig
from bertbench.models import build_model

VARIANTS = (("baseline", None), ("recompute", "full"), ("recompute", "every-k"), ("recompute", "selective"))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12, help="Transformer blocks (BERT-base: 12).")
    parser.add_argument("--hidden", type=int, default=768, help="Hidden size (BERT-base: 768); heads = hidden/64.")
    parser.add_argument("--batch", type=int, default=8, help="Sequences per step.")
    parser.add_argument("--seq", type=int, default=128, help="Sequence length of the HF comparison.")
    parser.add_argument("--long-seq", type=int, default=512, help="Sequence length of the recompute comparison.")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed steps per contender.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed steps per contender (median reported).")
    parser.add_argument("--skip-hf", action="store_true", help="Skip the HF transformers comparison.")
    parser.add_argument("--compile", action="store_true",
                        help="Add the baseline under torch.compile to the HF comparison (compiles for minutes).")
    parser.add_argument("--skip-recompute", action="store_true", help="Skip the recompute-policy comparison.")
    parser.add_argument("--output", help="Write every figure to this JSON file.")
    return parser.parse_args(argv)


def bert_config(args) -> BertConfig:
    return BertConfig(vocab_size=30522, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden)


def random_batch(config: BertConfig, batch: int, seq: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(1000, config.vocab_size, (batch, seq), generator=generator),
            "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous(),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch,), generator=generator)}


def adamw(model):
    # fused: one kernel over all parameters instead of PyTorch's per-tensor loop on CPU (~10x faster step)
    return torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)


def compare_with_hf(args, config, peak):
    import transformers

    batch = random_batch(config, args.batch, args.seq)
    torch.manual_seed(0)
    ours = build_model("classification", config, num_labels=2).train()
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**config.to_hf_dict(), num_labels=2))
    hf.load_state_dict(ours.state_dict(), strict=False)
    hf.train()
    steps = {"bertbench baseline": measure.make_train_step(ours, adamw(ours), batch),
             f"HF BertForSequenceClassification ({hf.config._attn_implementation})":
                 measure.make_train_step(hf, adamw(hf), batch)}
    if args.compile:
        torch.manual_seed(0)
        compiled = build_model("classification", config, num_labels=2).train()
        steps["bertbench baseline, torch.compile"] = measure.make_train_step(
            torch.compile(compiled), adamw(compiled), batch)
    flops = measure.count_flops(lambda: ours(**batch).loss.backward())
    ours.zero_grad(set_to_none=True)
    times = measure.time_steps(steps, args.warmup, args.repeats)
    rows = []
    for name, seconds in times.items():
        step = statistics.median(seconds)
        rows.append({"model": name, "step_s": step, "step_min_s": min(seconds), "step_max_s": max(seconds),
                     "seq_per_s": args.batch / step,
                     "tflops": flops / step / 1e12, "share_of_matmul_peak": flops / step / peak})
    for row in rows:
        row["speed_vs_hf"] = rows[1]["step_s"] / row["step_s"]
    return {"batch": args.batch, "seq": args.seq, "flops_per_step": flops, "rows": rows,
            "speedup_vs_hf": rows[1]["step_s"] / rows[0]["step_s"]}


def compare_recompute(args, config):
    batch = random_batch(config, args.batch, args.long_seq)
    models = {}
    for modeling_name, policy in VARIANTS:
        torch.manual_seed(0)
        name = modeling_name if policy is None else f"recompute/{policy}"
        models[name] = build_model("classification", config, modeling_name, policy or "full", num_labels=2).train()
    saved = {name: measure.forward_backward_saved_bytes(model, batch) for name, model in models.items()}
    steps = {name: measure.make_train_step(model, adamw(model), batch) for name, model in models.items()}
    times = measure.time_steps(steps, args.warmup, args.repeats)
    step_s = {name: statistics.median(seconds) for name, seconds in times.items()}
    rows = [{"model": name, "saved_bytes": saved[name], "saved_mib": saved[name] / 2**20,
             "bytes_vs_baseline": saved[name] / saved["baseline"], "step_s": step_s[name],
             "time_vs_baseline": step_s[name] / step_s["baseline"]} for name in models]
    return {"batch": args.batch, "seq": args.long_seq, "rows": rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    config = bert_config(args)
    peak = measure.matmul_flops_per_second()
    report = {"machine": machine(),
              "model": {"layers": args.layers, "hidden": args.hidden}, "matmul_fp32_flops": peak}
    print(f"{args.layers} layers, hidden {args.hidden}; torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; measured fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")
    if not args.skip_hf:
        report["vs_hf"] = result = compare_with_hf(args, config, peak)
        print(f"\n## Train step, batch {args.batch}, seq {args.seq}, fp32, AdamW "
              f"({result['flops_per_step'] / 1e9:.0f} GFLOP per step)\n")
        print(markdown_table(result["rows"], [("model", "model", "s"), ("step s (median)", "step_s", ".3f"),
                                              ("min", "step_min_s", ".3f"), ("max", "step_max_s", ".3f"),
                                              ("seq/s", "seq_per_s", ".2f"), ("TFLOP/s", "tflops", ".3f"),
                                              ("of matmul peak", "share_of_matmul_peak", ".1%"),
                                              ("speed vs HF", "speed_vs_hf", ".3f")]))
        print(f"\nbertbench baseline vs HF: {result['speedup_vs_hf']:.3f}x")
    if not args.skip_recompute:
        report["recompute"] = result = compare_recompute(args, config)
        print(f"\n## Recompute policies, batch {args.batch}, seq {args.long_seq}, fp32, AdamW\n")
        print(markdown_table(result["rows"], [("model", "model", "s"),
                                              ("saved for backward (MiB)", "saved_mib", ",.1f"),
                                              ("bytes vs baseline", "bytes_vs_baseline", ".3f"),
                                              ("step s", "step_s", ".3f"),
                                              ("time vs baseline", "time_vs_baseline", ".3f")]))
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
