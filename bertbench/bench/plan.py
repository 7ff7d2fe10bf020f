"""`bertbench bench plan`: predict data-parallel throughput, efficiency and time-to-train on a cluster this machine
cannot reach, from a measured single-device step, the model's gradient size and the network (the alpha-beta model).

Weak scaling: every device keeps the measured per-device batch b, so N devices train on a global batch of N x b and a
step takes the measured single-device time plus the part of the gradient all-reduce the backward does not hide:

    step(N) = compute + (1 - overlap) x allreduce(N)        throughput(N) = N x b / step(N)
    efficiency(N) = throughput(N) / (N x throughput(1)) = compute / step(N)

overlap = 0 (the default) hides nothing: a conservative bound. DDP all-reduces gradient buckets while the backward
still runs, so real runs land between overlap 0 and the compute-bound limit overlap = 1 (efficiency 1).

A ring all-reduce of B bytes over P ranks takes 2(P-1) steps, each paying a latency alpha, and moves 2(P-1)/P x B
bytes through each rank's link of bandwidth bw (nccl-tests calls bw the "bus bandwidth", busbw = algbw x 2(P-1)/P):

    ring(B, P, alpha, bw) = 2(P-1) x alpha x k + 2(P-1)/P x B / bw        (0 when P = 1)

where k is the number of DDP buckets (ceil(B / --bucket_mb), 1 with --bucket_mb 0): each bucket is its own
all-reduce and pays the latency again; the bytes are the same. On M nodes of G GPUs the all-reduce is modelled as
hierarchical: a reduce-scatter inside each node (NVLink), an all-reduce across nodes of each GPU's 1/G shard, an
all-gather inside the node. The two intra-node halves together cost a ring over G; across nodes, the G
shard rings of a node share the node's NIC(s), so the node moves 2(M-1)/M x B bytes through them in all:

    allreduce(M x G) = ring(B, G, alpha_intra, bw_intra) + ring(B, M, alpha_inter, bw_inter_node)

One node has no inter-node term and one GPU per node no intra-node term. NCCL's multi-node ring (one ring per NIC
through every GPU) puts the same 2(M-1)/M x B bytes per node through the NICs, so the bandwidth term holds for it too;
its latency grows with every GPU rather than every node, and its tree algorithm's with log2(nodes): the latency term
here sits between the two.

The default network is an assumption to replace with the cluster's own figures: for --intra_bandwidth, the busbw
nccl-tests' all_reduce_perf reports at a large size on the GPUs of one node; for --inter_bandwidth, the node's NIC
ports x line rate (or all_reduce_perf on M nodes: 2(M-1)/M x bytes / (its time - the intra-node part)).
`--validate scaling.json` checks the model against a `bertbench bench scaling` run: with the alpha and bw fitted
there (fit_alpha_beta) and its 1-process step, it predicts each measured process count and reports the error.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

from bertbench.bench import cli
from bertbench.bench.output import BenchOutput, efficiency_column, markdown_table, spread_column, superlinear_warning
from bertbench.bench.plots import line_plot
from bertbench.bench.workload import STEP_KINDS, BenchError, bert_config
from bertbench.common.flags import description
from bertbench.common.noise import noisy_warning, spread_text
from bertbench.model.config import BertConfig

# NVIDIA's BERT-large pre-training recipe (DeepLearningExamples, PyTorch/LanguageModeling/BERT), phase 1 at seq 128:
# 7038 steps of 65536 sequences. Phase 2 (1563 steps of 32768 at seq 512) is a second plan with a seq-512 step.
PHASE1_SEQUENCES = 7038 * 65536
GB = 1e9  # nccl-tests' GB/s


def parameter_count(config: BertConfig, kind: str, num_labels: int = 2) -> int:
    """Trainable parameters of BertForPreTraining ("pretraining") or BertForSequenceClassification ("finetuning"),
    counted from the config; the MLM decoder's weight is the word-embedding matrix and counts once."""
    h, vocab = config.hidden_size, config.vocab_size
    if kind == "pretraining":
        # MLM transform (dense + LayerNorm), the decoder's own bias, NSP classifier.
        heads = (h * h + h + 2 * h) + vocab + (2 * h + 2)
    elif kind == "finetuning":
        heads = h * num_labels + num_labels
    else:
        raise BenchError(f"unknown step kind {kind!r}: use {' or '.join(STEP_KINDS)}")
    return config.encoder_parameter_count() + heads


@dataclass(frozen=True)
class Network:
    """Bus bandwidths in bytes/s and per-step latencies in seconds: intra-node per GPU, inter-node per node."""

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float


def ring_seconds(nbytes: float, ranks: int, latency: float, bandwidth: float, buckets: int = 1) -> float:
    """A ring all-reduce of nbytes over `ranks`, issued as `buckets` all-reduces: 2(P-1) alpha per bucket plus
    2(P-1)/P x B / bw."""
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * latency * buckets + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def allreduce_seconds(
    nbytes: float, nodes: int, gpus_per_node: int, network: Network, buckets: int = 1
) -> tuple[float, float]:
    """(intra-node, inter-node) seconds of the hierarchical all-reduce of nbytes on nodes x gpus_per_node."""
    intra = ring_seconds(nbytes, gpus_per_node, network.intra_latency, network.intra_bandwidth, buckets)
    inter = ring_seconds(nbytes, nodes, network.inter_latency, network.inter_bandwidth, buckets)
    return intra, inter


def bucket_count(nbytes: float, bucket_mb: float) -> int:
    """DDP's buckets of bucket_mb MiB (its bucket_cap_mb); 0 means one all-reduce of the whole gradient."""
    return max(1, math.ceil(nbytes / (bucket_mb * 2**20))) if bucket_mb > 0 else 1


def predict(
    compute_seconds: float,
    batch_per_device: int,
    gradient_bytes: float,
    nodes: int,
    gpus_per_node: int,
    network: Network,
    overlap: float,
    buckets: int,
    train_sequences: float,
) -> dict[str, Any]:
    """One row of the plan: nodes x gpus_per_node devices, each a batch_per_device step of compute_seconds."""
    intra, inter = allreduce_seconds(gradient_bytes, nodes, gpus_per_node, network, buckets)
    exposed = (1 - overlap) * (intra + inter)
    step = compute_seconds + exposed
    gpus = nodes * gpus_per_node
    throughput = gpus * batch_per_device / step
    speedup = throughput / (batch_per_device / compute_seconds)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "gpus": gpus,
        "global_batch": gpus * batch_per_device,
        "compute_seconds": compute_seconds,
        "allreduce_intra_seconds": intra,
        "allreduce_inter_seconds": inter,
        "allreduce_seconds": intra + inter,
        "allreduce_latency_seconds": sum(allreduce_seconds(0.0, nodes, gpus_per_node, network, buckets)),
        "exposed_allreduce_seconds": exposed,
        "step_seconds": step,
        "seq_per_s": throughput,
        "speedup": speedup,
        "efficiency": speedup / gpus,
        "time_to_train_hours": train_sequences / throughput / 3600,
    }


def fit_alpha_beta(sizes_bytes: Sequence[float], seconds: Sequence[float], processes: int) -> tuple[float, float]:
    """(alpha in seconds, bus bandwidth in bytes/s) fitted by least squares to ring all-reduce times:
    t = 2(P-1) alpha + 2(P-1)/P x B / bw. The residuals are absolute, so the largest, bandwidth-bound sizes (where a
    gradient all-reduce lives) decide bw, and alpha is the less certain intercept; it is kept >= 0 (a negative
    intercept is noise: the fit is redone through 0)."""
    if processes < 2:
        raise BenchError(f"fitting an all-reduce needs 2 or more processes, got {processes}")
    if len(sizes_bytes) != len(seconds) or len(set(sizes_bytes)) < 2:
        raise BenchError("fitting an all-reduce needs times of two or more different sizes")
    steps = 2 * (processes - 1)
    moved = numpy.asarray(sizes_bytes, dtype=float) * steps / processes
    times = numpy.asarray(seconds, dtype=float)
    (intercept, slope), *_ = numpy.linalg.lstsq(numpy.stack([numpy.ones_like(moved), moved], 1), times, rcond=None)
    if intercept < 0:
        intercept, slope = 0.0, float(moved @ times / (moved @ moved))
    if slope <= 0:
        raise BenchError(
            f"all-reduce times do not grow with the size (largest {max(sizes_bytes):,.0f} bytes): "
            "cannot fit a bandwidth; time a bandwidth-bound size (16 MiB or more) too"
        )
    return float(intercept) / steps, 1.0 / float(slope)


# ---- reading other benches' JSON ------------------------------------------------------------------------------------


def read_report(path: str, bench: str) -> dict[str, Any]:
    """A `bertbench bench <bench>` JSON file; a missing file, bad JSON or another bench's file is a BenchError."""
    try:
        with open(path) as handle:
            report = json.load(handle)
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BenchError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(report, dict) or report.get("bench") != bench:
        raise BenchError(f"{path}: not a `bertbench bench {bench}` report (key 'bench' is not {bench!r})")
    return report


def json_field(record: Any, key: str, path: str, where: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    """record[key] of the expected type, else a BenchError naming the file and the key's place (`where`)."""
    if not isinstance(record, dict) or key not in record:
        raise BenchError(f"{path}: missing key {where}{key}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BenchError(f"{path}: key {where}{key} has an unusable value {value!r}")
    return value


def positive_field(record: Any, key: str, path: str, where: str) -> float:
    value = json_field(record, key, path, where)
    if value <= 0:
        raise BenchError(f"{path}: key {where}{key} must be positive, got {value!r}")
    return value


THROUGHPUT_FILTERS = (
    ("model", "model", str),
    ("kind", "kind", str),
    ("variant", "variant", str),
    ("precision", "precision", str),
    ("batch", "batch_per_device", int),
    ("seq", "seq", int),
)


def throughput_row(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """The one row of a throughput.json that --model/--kind/--variant/--precision/--batch_per_device/--seq select."""
    rows = json_field(read_report(path, "throughput"), "rows", path, "", list)
    for index, row in enumerate(rows):
        for key, _, kind in THROUGHPUT_FILTERS:
            json_field(row, key, path, f"rows[{index}].", kind)
        positive_field(row, "step_seconds", path, f"rows[{index}].")
    wanted = {key: getattr(args, option) for key, option, _ in THROUGHPUT_FILTERS if getattr(args, option) is not None}
    matches = [row for row in rows if all(row[key] == value for key, value in wanted.items())]
    if len(matches) == 1:
        return matches[0]
    described = "; ".join(
        " ".join(f"{key} {row[key]}" for key, _, _ in THROUGHPUT_FILTERS) for row in (matches or rows)
    )
    if not matches:
        asked = ", ".join(f"{key} {value}" for key, value in wanted.items())
        raise BenchError(f"{path}: no row has {asked}; it has: {described}")
    raise BenchError(
        f"{path}: {len(matches)} rows match; choose one with --model/--kind/--variant/--precision/"
        f"--batch_per_device/--seq: {described}"
    )


def points(predicted: float, measured: float) -> float:
    """predicted - measured efficiency in percentage points; float noise rounded off, so an exact match prints 0.0
    (+ 0.0 turns round's -0.0 into 0.0)."""
    return round(100 * (predicted - measured), 6) + 0.0


def validate(path: str, overlap: float, bucket_mb: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Predicted vs measured efficiency of each model and process count of a `bertbench bench scaling` report, from
    its 1-process step and its fitted all-reduce (a flat ring: all processes of a run share one node); and the
    warnings that report carries (a busy machine, runs not alike), which qualify the measured side."""
    report = read_report(path, "scaling")
    models = json_field(report, "models", path, "", list)
    results = []
    for m, entry in enumerate(models):
        where = f"models[{m}]."
        name = json_field(entry, "model", path, where, str)
        gradient_bytes = positive_field(entry, "gradient_bytes", path, where)
        allreduce = json_field(entry, "allreduce", path, where, dict)
        alpha = json_field(allreduce, "latency_seconds", path, f"{where}allreduce.")
        bandwidth = positive_field(allreduce, "bus_bandwidth_bytes_per_s", path, f"{where}allreduce.")
        if alpha < 0:
            raise BenchError(f"{path}: key {where}allreduce.latency_seconds is negative")
        rows = json_field(entry, "rows", path, where, list)
        measured = []
        for r, row in enumerate(rows):
            values = {
                key: positive_field(row, key, path, f"{where}rows[{r}].")
                for key in ("processes", "batch_per_process", "step_seconds")
            }
            values["efficiency"] = json_field(row, "efficiency", path, f"{where}rows[{r}].")
            values["nodes"] = row.get("nodes", 1)
            # the step's spread, where the scaling run measured one
            values["spread"] = {
                f"measured_step_seconds{suffix}": row.get(f"step_seconds{suffix}") for suffix in ("_min", "_max", "_cv")
            }
            measured.append(values)
        single = [row for row in measured if row["processes"] == 1]
        if not single:
            raise BenchError(f"{path}: {where}rows has no row with processes 1 (the compute time)")
        compute, batch = single[0]["step_seconds"], single[0]["batch_per_process"]
        buckets = bucket_count(gradient_bytes, bucket_mb)
        for row in measured:
            # Per-process compute scales with the per-process batch (1 under weak scaling, as the scaling bench runs).
            row_compute = compute * row["batch_per_process"] / batch
            allreduce_time = ring_seconds(gradient_bytes, int(row["processes"]), alpha, bandwidth, buckets)
            predicted = {}
            for label, hidden in (("no_overlap", 0.0), ("overlap", overlap)):
                step = row_compute + (1 - hidden) * allreduce_time
                predicted[label] = (row["batch_per_process"] / step) / (batch / compute)
            results.append(
                {
                    "model": name,
                    "nodes": row["nodes"],
                    "processes": int(row["processes"]),
                    "measured_step_seconds": row["step_seconds"],
                    **row["spread"],
                    "predicted_allreduce_seconds": allreduce_time,
                    "measured_efficiency": row["efficiency"],
                    "predicted_efficiency_no_overlap": predicted["no_overlap"],
                    "error_pp_no_overlap": points(predicted["no_overlap"], row["efficiency"]),
                    "predicted_efficiency": predicted["overlap"],
                    "error_pp": points(predicted["overlap"], row["efficiency"]),
                    "latency_seconds": alpha,
                    "bus_bandwidth_bytes_per_s": bandwidth,
                    "gradient_bytes": gradient_bytes,
                    "buckets": buckets,
                }
            )
    return results, [message for message in report.get("warnings", []) if isinstance(message, str)]


# ---- the command ----------------------------------------------------------------------------------------------------


def layout(text: str) -> tuple[int, int]:
    """ "NODESxGPUS" such as 128x8."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"{text!r} is not NODESxGPUS with both positive, such as 2x4")
    return int(match[1]), int(match[2])


def number(low: float, high: float = math.inf, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type for a float in [low, high] ((low, high] when low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not (value > low if low_open else value >= low) or value > high:
            bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{value:g} is outside {bounds}")
        return value

    return parse


POSITIVE = number(0.0, low_open=True)
NON_NEGATIVE = number(0.0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser_for("plan", description(__doc__))
    model = parser.add_argument_group("model")
    cli.add_model_flag(model, None, "; unset: base, or the --from_throughput row's model")
    model.add_argument(
        "--kind",
        choices=STEP_KINDS,
        default=None,
        help="pretraining (MLM + NSP heads) or finetuning (2-way classifier); unset: pretraining, "
        "or the --from_throughput row's kind.",
    )
    model.add_argument(
        "--gradient_bytes_per_parameter",
        type=POSITIVE,
        default=4.0,
        help="4: fp32 gradients (also under bf16/fp16 autocast, whose weights stay fp32); 2: bf16 gradients.",
    )
    step = parser.add_argument_group("the measured single-device step")
    step.add_argument(
        "--step_seconds",
        type=POSITIVE,
        default=None,
        help="Seconds of one training step on one device at --batch_per_device.",
    )
    step.add_argument(
        "--batch_per_device",
        type=cli.positive_int,
        default=None,
        help="Sequences per device and step (also selects the --from_throughput row).",
    )
    step.add_argument(
        "--from_throughput",
        metavar="FILE",
        default=None,
        help="Take the step from a `bertbench bench throughput` throughput.json instead.",
    )
    step.add_argument("--variant", default=None, help="Select the --from_throughput row of this variant.")
    step.add_argument("--precision", default=None, help="Select the --from_throughput row of this precision.")
    step.add_argument(
        "--seq",
        type=cli.positive_int,
        default=None,
        help="Sequence length of the step (also selects the --from_throughput row); sets the "
        "position table of a named --model when over 512.",
    )
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--gpus_per_node", type=cli.positive_int, default=8, help="GPUs of each node.")
    cluster.add_argument(
        "--nodes",
        type=cli.comma_list(cli.positive_int),
        default=[1, 2, 4, 8, 16, 32, 64, 128],
        help="Node counts to predict, each with --gpus_per_node GPUs.",
    )
    cluster.add_argument(
        "--layouts",
        type=cli.comma_list(layout),
        default=None,
        help="NODESxGPUS layouts such as 2x4,128x8, instead of --nodes x --gpus_per_node.",
    )
    network = parser.add_argument_group(
        "network (assumptions: replace them with all_reduce_perf figures from nccl-tests on your cluster)"
    )
    network.add_argument(
        "--intra_bandwidth",
        type=POSITIVE,
        default=150.0,
        help="All-reduce bus bandwidth per GPU inside a node, GB/s. 150: half of an A100's NVLink "
        "bandwidth per direction (300 GB/s), a conservative NVLink figure; PCIe-only nodes "
        "reach far less.",
    )
    network.add_argument(
        "--intra_latency_us",
        type=NON_NEGATIVE,
        default=5.0,
        help="Latency of one ring step inside a node, microseconds.",
    )
    network.add_argument(
        "--inter_bandwidth",
        type=POSITIVE,
        default=25.0,
        help="NIC bandwidth of a node, GB/s, shared by its GPUs. 25: one 200 Gb/s InfiniBand HDR "
        "NIC; DGX-class nodes have one per GPU (8 x 25 = 200, or 8 x 50 = 400 with NDR).",
    )
    network.add_argument(
        "--inter_latency_us",
        type=NON_NEGATIVE,
        default=10.0,
        help="Latency of one ring step between nodes, microseconds.",
    )
    network.add_argument(
        "--bucket_mb",
        type=NON_NEGATIVE,
        default=25.0,
        help="DDP's bucket_cap_mb (MiB): each bucket is an all-reduce paying the latency terms; "
        "0: one all-reduce of the whole gradient.",
    )
    network.add_argument(
        "--overlap",
        type=number(0.0, 1.0),
        default=0.0,
        help="Share of the all-reduce hidden behind the backward: 0 is the conservative bound, 1 "
        "the compute-bound limit; DDP runs land in between.",
    )
    parser.add_argument(
        "--time_to_train_sequences",
        type=POSITIVE,
        default=PHASE1_SEQUENCES,
        help="Sequences to train on for the time-to-train column; the default is phase 1 (seq 128) "
        "of NVIDIA's BERT-large recipe: 7038 steps x 65536.",
    )
    parser.add_argument(
        "--validate",
        metavar="SCALING_JSON",
        default=None,
        help="Also compare the model with a `bertbench bench scaling` scaling.json: alpha and bus "
        "bandwidth from its all-reduce fit, compute from its 1-process step.",
    )
    args = parser.parse_args(argv)
    if args.step_seconds is not None and args.from_throughput is not None:
        parser.error("give --step_seconds or --from_throughput, not both")
    if args.step_seconds is not None and args.batch_per_device is None:
        parser.error("--step_seconds needs --batch_per_device")
    if args.from_throughput is None and (args.variant is not None or args.precision is not None):
        parser.error("--variant and --precision select a --from_throughput row")
    if args.step_seconds is None and args.from_throughput is None and args.validate is None:
        parser.error(
            "give the measured step: --step_seconds and --batch_per_device, or --from_throughput FILE "
            "(or only --validate SCALING_JSON)"
        )
    return args


PLAN_COLUMNS = [
    ("nodes", "nodes", "d"),
    ("GPUs", "gpus", "d"),
    ("global batch", "global_batch", "d"),
    ("step (s)", "step_seconds", ".4f"),
    ("all-reduce (s)", "allreduce_seconds", ".4f"),
    ("exposed (s)", "exposed_allreduce_seconds", ".4f"),
    ("seq/s", "seq_per_s", ",.0f"),
    ("speedup", "speedup", ".1f"),
    ("efficiency", "efficiency", ".1%"),
    ("time to train (h)", "time_to_train_hours", ",.1f"),
]
VALIDATION_COLUMNS = [
    ("model", "model", "s"),
    ("processes", "processes", "d"),
    spread_column("step (s): median (min–max, CV)", "measured_step_seconds", ".4f"),
    ("all-reduce, model (s)", "predicted_allreduce_seconds", ".4f"),
    efficiency_column("measured", "measured_efficiency"),
    ("predicted, overlap 0", "predicted_efficiency_no_overlap", ".1%"),
    ("error, overlap 0 (pp)", "error_pp_no_overlap", "+.1f"),
    ("predicted, --overlap", "predicted_efficiency", ".1%"),
    ("error (pp)", "error_pp", "+.1f"),
]


def plan(
    args: argparse.Namespace, network: Network
) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any], str | None]:
    """(settings, figures, markdown, plots, warning) of the prediction over the layouts; the warning says when the
    measured step it starts from was noisy."""
    if args.from_throughput is not None:
        row = throughput_row(args.from_throughput, args)
        model, kind, seq, batch = row["model"], row["kind"], row["seq"], row["batch"]
        compute, source = row["step_seconds"], f"{args.from_throughput}: {row['variant']} {row['precision']}"
        measured = {
            key: row.get(key) for key in ("step_seconds", "step_seconds_min", "step_seconds_max", "step_seconds_cv")
        }
    else:
        model, kind, seq, batch = args.model or "base", args.kind or "pretraining", args.seq, args.batch_per_device
        compute, source = args.step_seconds, "--step_seconds"
        measured = {"step_seconds": compute}
    # Parameters depend on the sequence length only through a named size's position table (512 up to seq 512).
    parameters = parameter_count(bert_config(model, seq or 1), kind)
    gradient_bytes = parameters * args.gradient_bytes_per_parameter
    buckets = bucket_count(gradient_bytes, args.bucket_mb)
    layouts = sorted(args.layouts or [(nodes, args.gpus_per_node) for nodes in args.nodes], key=lambda x: x[0] * x[1])
    rows = [
        predict(
            compute, batch, gradient_bytes, nodes, gpus, network, args.overlap, buckets, args.time_to_train_sequences
        )
        for nodes, gpus in layouts
    ]
    settings = {
        "model": model,
        "kind": kind,
        "seq": seq,
        "batch_per_device": batch,
        **measured,
        "step_source": source,
        "parameters": parameters,
        "gradient_bytes": gradient_bytes,
        "buckets": buckets,
        "layouts": [f"{nodes}x{gpus}" for nodes, gpus in layouts],
    }
    step = spread_text(measured, "step_seconds", ".4g")
    title = (
        f"Data-parallel plan: {model} {kind}, batch {batch} per device, {step} s per single-device step "
        f"({source}); {parameters / 1e6:.1f} M parameters = "
        f"{gradient_bytes / 2**20:,.0f} MiB of gradients in "
        f"{buckets} bucket(s); overlap {args.overlap:g}; network: intra {args.intra_bandwidth:g} GB/s + "
        f"{args.intra_latency_us:g} us, inter {args.inter_bandwidth:g} GB/s per node + "
        f"{args.inter_latency_us:g} us; time to train {args.time_to_train_sequences:,.0f} sequences."
    )
    gpus = [row["gpus"] for row in rows]
    # The layouts' predictions are points (markers, not joined: between two layouts the model is no straight line
    # on these axes); linear scaling is drawn at many GPU counts, so it is the curve it is.
    dense = numpy.geomspace(gpus[0], gpus[-1], 200) if gpus[-1] > gpus[0] else numpy.asarray(gpus, dtype=float)
    plots = {
        "efficiency": line_plot(
            {f"overlap {args.overlap:g}": (gpus, [row["efficiency"] for row in rows])},
            "GPUs",
            "scaling efficiency",
            f"{model} {kind}: predicted efficiency",
            log_x=True,
            reference=(gpus, [1.0] * len(gpus), "compute-bound (all hidden)"),
            joined=False,
            y_from_zero=True,
        ),
        "throughput": line_plot(
            {f"overlap {args.overlap:g}": (gpus, [row["seq_per_s"] for row in rows])},
            "GPUs",
            "sequences/s",
            f"{model} {kind}: predicted throughput",
            log_x=True,
            log_y=True,
            reference=(dense, dense * batch / compute, "linear"),
            joined=False,
        ),
    }
    noisy = noisy_warning([measured], "step_seconds", lambda _: source, "measured step")
    return settings, {"rows": rows}, f"{title}\n\n{markdown_table(rows, PLAN_COLUMNS)}", plots, noisy


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    def body() -> int:
        network = Network(
            args.intra_bandwidth * GB,
            args.intra_latency_us * 1e-6,
            args.inter_bandwidth * GB,
            args.inter_latency_us * 1e-6,
        )
        settings: dict[str, Any] = {
            name: value for name, value in vars(args).items() if name not in ("output_dir", "overwrite")
        }
        figures: dict[str, Any] = {}
        sections: list[str] = []
        plots: Mapping[str, Any] = {}
        output = BenchOutput(cli.output_dir(args, "plan"), "plan", argv, args.overwrite)
        if args.step_seconds is not None or args.from_throughput is not None:
            plan_settings, figures, markdown, plots, noisy = plan(args, network)
            settings.update(plan_settings)
            sections.append(markdown)
            output.warn(noisy)
        if args.validate is not None:
            figures["validation"], measured_warnings = validate(args.validate, args.overlap, args.bucket_mb)
            sections.append(
                f"Validation against {args.validate} (alpha and bus bandwidth fitted there; error = "
                f"predicted - measured efficiency; --overlap {args.overlap:g}):\n\n"
                + markdown_table(figures["validation"], VALIDATION_COLUMNS)
            )
            for message in measured_warnings:
                output.warn(f"{args.validate} says: {message}")
            output.warn(
                superlinear_warning(
                    figures["validation"],
                    "measured_efficiency",
                    lambda row: f"{row['processes']} processes of {row['model']}",
                )
            )
        print(output.write(settings, figures, "\n\n".join(sections), plots))
        return 0

    return cli.run("bertbench bench plan", body)
