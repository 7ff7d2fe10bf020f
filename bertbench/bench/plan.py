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

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy

from bertbench.bench import settings as bench_settings
from bertbench.bench.errors import BenchError
from bertbench.bench.output import BenchOutput, superlinear, superlinear_warning, with_warnings
from bertbench.bench.plots import line_plot
from bertbench.bench.results import BenchResult, Column, Ratio, Row, Spread, noisy_ratios_note, table
from bertbench.bench.settings import BenchSettings, model_setting
from bertbench.bench.workload import STEP_KINDS, bert_config
from bertbench.common.flags import description, setting
from bertbench.common.noise import noisy_warning
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


@dataclasses.dataclass(frozen=True)
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


# ---- the settings -------------------------------------------------------------------------------------------------


def layout(text: str) -> tuple[int, int]:
    """ "NODESxGPUS" such as 128x8."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"layouts: {text!r} is not NODESxGPUS with both positive, such as 2x4")
    return int(match[1]), int(match[2])


@dataclasses.dataclass(frozen=True)
class PlanSettings(BenchSettings):
    """Model, measured step, cluster and network.

    The network's defaults are assumptions: replace them with all_reduce_perf figures from nccl-tests on your
    cluster."""

    bench = "plan"

    model: str | None = model_setting(None, "; unset: base, or the --from_throughput row's model")
    kind: str | None = setting(
        "pretraining (MLM + NSP heads) or finetuning (2-way classifier); unset: pretraining, or the "
        "--from_throughput row's kind.",
        None,
        choices=STEP_KINDS,
    )
    gradient_bytes_per_parameter: float = setting(
        "4: fp32 gradients (also under bf16/fp16 autocast, whose weights stay fp32); 2: bf16 gradients.",
        4.0,
        positive=True,
    )
    step_seconds: float | None = setting(
        "Seconds of one training step on one device at --batch_per_device.", None, positive=True
    )
    batch_per_device: int | None = setting(
        "Sequences per device and step (also selects the --from_throughput row).", None, positive=True
    )
    from_throughput: str | None = setting(
        "Take the step from a `bertbench bench throughput` throughput.json instead.", None
    )
    variant: str | None = setting("Select the --from_throughput row of this variant.", None)
    precision: str | None = setting("Select the --from_throughput row of this precision.", None)
    lengths: str | None = setting("Select the --from_throughput row of these lengths (its --lengths).", None)
    seq: int | None = setting(
        "Sequence length of the step (also selects the --from_throughput row); sets the position table of a "
        "named --model when over 512.",
        None,
        positive=True,
    )
    gpus_per_node: int = setting("GPUs of each node.", 8, positive=True)
    nodes: tuple[int, ...] = setting(
        "Node counts to predict, each with --gpus_per_node GPUs.", (1, 2, 4, 8, 16, 32, 64, 128), positive=True
    )
    layouts: tuple[str, ...] | None = setting(
        "NODESxGPUS layouts such as 2x4,128x8, instead of --nodes x --gpus_per_node.", None
    )
    intra_bandwidth: float = setting(
        "All-reduce bus bandwidth per GPU inside a node, GB/s. 150: half of an A100's NVLink bandwidth per "
        "direction (300 GB/s), a conservative NVLink figure; PCIe-only nodes reach far less.",
        150.0,
        positive=True,
    )
    intra_latency_us: float = setting("Latency of one ring step inside a node, microseconds.", 5.0, at_least=0)
    inter_bandwidth: float = setting(
        "NIC bandwidth of a node, GB/s, shared by its GPUs. 25: one 200 Gb/s InfiniBand HDR NIC; DGX-class "
        "nodes have one per GPU (8 x 25 = 200, or 8 x 50 = 400 with NDR).",
        25.0,
        positive=True,
    )
    inter_latency_us: float = setting("Latency of one ring step between nodes, microseconds.", 10.0, at_least=0)
    bucket_mb: float = setting(
        "DDP's bucket_cap_mb (MiB): each bucket is an all-reduce paying the latency terms; 0: one all-reduce of "
        "the whole gradient.",
        25.0,
        at_least=0,
    )
    overlap: float = setting(
        "Share of the all-reduce hidden behind the backward, in [0, 1]: 0 is the conservative bound, 1 the "
        "compute-bound limit; DDP runs land in between.",
        0.0,
    )
    time_to_train_sequences: float = setting(
        "Sequences to train on for the time-to-train column; the default is phase 1 (seq 128) of NVIDIA's "
        "BERT-large recipe: 7038 steps x 65536.",
        PHASE1_SEQUENCES,
        positive=True,
    )
    validate: str | None = setting(
        "Also compare the model with a `bertbench bench scaling` scaling.json: alpha and bus bandwidth from its "
        "all-reduce fit, compute from its 1-process step.",
        None,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        numbers = ("gradient_bytes_per_parameter", "step_seconds", "intra_bandwidth", "intra_latency_us")
        numbers += ("inter_bandwidth", "inter_latency_us", "bucket_mb", "overlap", "time_to_train_sequences")
        for name in numbers:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap:g}")
        for text in self.layouts or ():
            layout(text)
        if self.step_seconds is not None and self.from_throughput is not None:
            raise ValueError("give step_seconds or from_throughput, not both")
        if self.step_seconds is not None and self.batch_per_device is None:
            raise ValueError("step_seconds needs batch_per_device")
        selecting = [name for name in ("variant", "precision", "lengths") if getattr(self, name) is not None]
        if self.from_throughput is None and selecting:
            raise ValueError(f"{', '.join(selecting)} select a from_throughput row: give from_throughput")
        if self.step_seconds is None and self.from_throughput is None and self.validate is None:
            raise ValueError(
                "give the measured step: step_seconds and batch_per_device, or from_throughput FILE (or only "
                "validate SCALING_JSON)"
            )

    @property
    def layout_pairs(self) -> list[tuple[int, int]]:
        """(nodes, GPUs per node) of each layout to predict, by GPU count."""
        pairs = (
            [layout(text) for text in self.layouts] if self.layouts else [(n, self.gpus_per_node) for n in self.nodes]
        )
        return sorted(pairs, key=lambda pair: pair[0] * pair[1])

    @property
    def network(self) -> Network:
        return Network(
            self.intra_bandwidth * GB,
            self.intra_latency_us * 1e-6,
            self.inter_bandwidth * GB,
            self.inter_latency_us * 1e-6,
        )


SETTINGS = PlanSettings


# ---- reading other benches' results -------------------------------------------------------------------------------


def read_result(path: str, bench: str) -> BenchResult:
    """A `bertbench bench <bench>` result; anything else (a missing file, bad JSON, another bench's result) is one
    line naming the file."""
    result = BenchResult.read(path)
    if result.bench != bench:
        raise BenchError(f"{path}: a `bertbench bench {result.bench}` result, not a `bertbench bench {bench}` one")
    return result


def field(
    record: Mapping[str, Any], key: str, path: str, where: str, kind: type | tuple[type, ...] = (int, float)
) -> Any:
    """record[key] of the expected type, else a BenchError naming the file and the key's place (`where`)."""
    if key not in record:
        raise BenchError(f"{path}: missing key {where}{key}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BenchError(f"{path}: key {where}{key} has an unusable value {value!r}")
    return value


def positive_field(record: Mapping[str, Any], key: str, path: str, where: str) -> float:
    value = field(record, key, path, where)
    if value <= 0:
        raise BenchError(f"{path}: key {where}{key} must be positive, got {value!r}")
    return value


def measured_step(row: Row, path: str, where: str) -> Spread:
    """A row's step_seconds column: a Spread of positive seconds."""
    step = field(row.columns, "step_seconds", path, f"{where}columns.", Spread)
    if not step.median > 0:
        raise BenchError(f"{path}: key {where}columns.step_seconds must be positive, got {step.median!r}")
    return step


# (the throughput row's setting key, the plan's setting that selects it, its type)
THROUGHPUT_FILTERS = (
    ("model", "model", str),
    ("kind", "kind", str),
    ("variant", "variant", str),
    ("precision", "precision", str),
    ("lengths", "lengths", str),
    ("batch", "batch_per_device", int),
    ("seq", "seq", int),
)


def throughput_row(settings: PlanSettings) -> Row:
    """The one measured row of --from_throughput that --model/--kind/--variant/--precision/--lengths/
    --batch_per_device/--seq select."""
    path = settings.from_throughput
    rows = [row for row in read_result(path, "throughput").rows_measuring("seq_per_s") if row.value is not None]
    for index, row in enumerate(rows):
        for key, _, kind in THROUGHPUT_FILTERS:
            field(row.setting, key, path, f"rows[{index}].setting.", kind)
        measured_step(row, path, f"rows[{index}].")
    wanted = {
        key: getattr(settings, name) for key, name, _ in THROUGHPUT_FILTERS if getattr(settings, name) is not None
    }
    matches = [row for row in rows if all(row.setting[key] == value for key, value in wanted.items())]
    if len(matches) == 1:
        return matches[0]
    described = "; ".join(
        " ".join(f"{key} {row.setting[key]}" for key, _, _ in THROUGHPUT_FILTERS) for row in (matches or rows)
    )
    if not matches:
        asked = ", ".join(f"{key} {value}" for key, value in wanted.items())
        raise BenchError(f"{path}: no measured row has {asked}; it has: {described or 'none'}")
    raise BenchError(
        f"{path}: {len(matches)} rows match; choose one with --model/--kind/--variant/--precision/--lengths/"
        f"--batch_per_device/--seq: {described}"
    )


def points(predicted: float, measured: float) -> float:
    """predicted - measured efficiency in percentage points; float noise rounded off, so an exact match prints 0.0
    (+ 0.0 turns round's -0.0 into 0.0)."""
    return round(100 * (predicted - measured), 6) + 0.0


def validate(settings: PlanSettings) -> tuple[list[Row], dict[str, Any], list[str]]:
    """The rows of predicted vs measured efficiency of each process count of a `bertbench bench scaling` result,
    from its 1-process step and its fitted all-reduce (a flat ring: all processes of a run share one node); what
    they were predicted with (context); and the warnings that result carries (a busy machine, runs not alike), which
    qualify the measured side."""
    path = settings.validate
    scaling = read_result(path, "scaling")
    gradient_bytes = positive_field(scaling.context, "gradient_bytes", path, "context.")
    alpha = field(scaling.context, "latency_seconds", path, "context.")
    bandwidth = positive_field(scaling.context, "bus_bandwidth_bytes_per_s", path, "context.")
    if alpha < 0:
        raise BenchError(f"{path}: key context.latency_seconds is negative")
    measured = []
    for index, row in enumerate(scaling.rows_measuring("seq_per_s")):
        where = f"rows[{index}]."
        measured.append(
            {
                "model": field(row.setting, "model", path, f"{where}setting.", str),
                "nodes": row.setting.get("nodes", 1),
                "processes": int(positive_field(row.setting, "processes", path, f"{where}setting.")),
                "batch": positive_field(row.setting, "batch_per_process", path, f"{where}setting."),
                "step": measured_step(row, path, where),
                "efficiency": field(row.columns, "efficiency", path, f"{where}columns.", Ratio),
            }
        )
    single = [row for row in measured if row["processes"] == 1]
    if not single:
        raise BenchError(f"{path}: no row measuring seq_per_s has processes 1 (the compute time)")
    compute, batch = single[0]["step"].median, single[0]["batch"]
    buckets = bucket_count(gradient_bytes, settings.bucket_mb)
    rows = []
    for row in measured:
        # Per-process compute scales with the per-process batch (1 under weak scaling, as the scaling bench runs).
        row_compute = compute * row["batch"] / batch
        allreduce_time = ring_seconds(gradient_bytes, row["processes"], alpha, bandwidth, buckets)
        predicted = {}
        for label, hidden in (("no_overlap", 0.0), ("overlap", settings.overlap)):
            step = row_compute + (1 - hidden) * allreduce_time
            predicted[label] = (row["batch"] / step) / (batch / compute)
        efficiency = row["efficiency"].value
        rows.append(
            Row(
                "step_seconds",
                "s",
                {"model": row["model"], "nodes": row["nodes"], "processes": row["processes"]},
                row["step"],
                {
                    "predicted_allreduce_seconds": allreduce_time,
                    "measured_efficiency": row["efficiency"],
                    "predicted_efficiency_no_overlap": predicted["no_overlap"],
                    "error_pp_no_overlap": points(predicted["no_overlap"], efficiency),
                    "predicted_efficiency": predicted["overlap"],
                    "error_pp": points(predicted["overlap"], efficiency),
                },
            )
        )
    context = {
        "validated": path,
        "latency_seconds": alpha,
        "bus_bandwidth_bytes_per_s": bandwidth,
        "gradient_bytes": gradient_bytes,
        "buckets": buckets,
    }
    return rows, context, list(scaling.warnings)


# ---- the command ----------------------------------------------------------------------------------------------------


def efficiency_text(ratio: Ratio) -> str:
    """An efficiency cell, "71.6%", flagged "253.7% (!)" above 100% (output.superlinear_warning says why), and
    marked when its inputs were noisy."""
    return ratio.text(".1%", suffix=" (!)" if superlinear(ratio.value) else "")


def efficiency_column(title: str, key: str) -> Column:
    return Column(title, key, lambda row: efficiency_text(row.get(key)))


PLAN_COLUMNS = [
    Column("nodes", "nodes", "d"),
    Column("GPUs", "gpus", "d"),
    Column("global batch", "global_batch", "d"),
    Column("step (s)", "step_seconds", ".4f"),
    Column("all-reduce (s)", "allreduce_seconds", ".4f"),
    Column("exposed (s)", "exposed_allreduce_seconds", ".4f"),
    Column("seq/s", "seq_per_s", ",.0f"),
    Column("speedup", "speedup", ".1f"),
    efficiency_column("efficiency", "efficiency"),
    Column("time to train (h)", "time_to_train_hours", ",.1f"),
]
VALIDATION_COLUMNS = [
    Column("model", "model", "s"),
    Column("processes", "processes", "d"),
    Column("step (s): median (min–max, CV)", "step_seconds", ".4f"),
    Column("all-reduce, model (s)", "predicted_allreduce_seconds", ".4f"),
    efficiency_column("measured", "measured_efficiency"),
    Column("predicted, overlap 0", "predicted_efficiency_no_overlap", ".1%"),
    Column("error, overlap 0 (pp)", "error_pp_no_overlap", "+.1f"),
    Column("predicted, --overlap", "predicted_efficiency", ".1%"),
    Column("error (pp)", "error_pp", "+.1f"),
]


def plan(settings: PlanSettings) -> tuple[list[Row], dict[str, Any], str, dict[str, Any], str | None]:
    """(rows, context, markdown, plots, warning) of the prediction over the layouts; the warning says when the
    measured step it starts from was noisy. A predicted speedup and efficiency carry the measured step's CV (its
    one measured input), so they are marked where that step was noisy."""
    if settings.from_throughput is not None:
        row = throughput_row(settings)
        model, kind, seq, batch = (row.setting[key] for key in ("model", "kind", "seq", "batch"))
        compute = row.columns["step_seconds"]
        source = f"{settings.from_throughput}: {row.setting['variant']} {row.setting['precision']}"
    else:
        model, kind, seq = settings.model or "base", settings.kind or "pretraining", settings.seq
        batch, compute, source = settings.batch_per_device, Spread.exact(settings.step_seconds), "--step_seconds"
    # Parameters depend on the sequence length only through a named size's position table (512 up to seq 512).
    parameters = parameter_count(bert_config(model, seq or 1), kind)
    gradient_bytes = parameters * settings.gradient_bytes_per_parameter
    buckets = bucket_count(gradient_bytes, settings.bucket_mb)
    predictions = [
        predict(
            compute.median,
            batch,
            gradient_bytes,
            nodes,
            gpus,
            settings.network,
            settings.overlap,
            buckets,
            settings.time_to_train_sequences,
        )
        for nodes, gpus in settings.layout_pairs
    ]
    rows = [
        Row(
            "seq_per_s",
            "seq/s",
            {"model": model, "kind": kind, "seq": seq, "batch_per_device": batch}
            | {key: predicted[key] for key in ("nodes", "gpus_per_node", "gpus")},
            Spread.exact(predicted["seq_per_s"]),
            {
                key: value
                for key, value in predicted.items()
                if key not in ("nodes", "gpus_per_node", "gpus", "seq_per_s")
            }
            | {key: Ratio(predicted[key], compute.cv) for key in ("speedup", "efficiency")},
            status="predicted",
        )
        for predicted in predictions
    ]
    context = {
        "step_seconds": compute,
        "step_source": source,
        "parameters": parameters,
        "gradient_bytes": gradient_bytes,
        "buckets": buckets,
    }
    title = (
        f"Data-parallel plan: {model} {kind}, batch {batch} per device, {compute.text('.4g')} s per single-device "
        f"step ({source}); {parameters / 1e6:.1f} M parameters = {gradient_bytes / 2**20:,.0f} MiB of gradients "
        f"in {buckets} bucket(s); overlap {settings.overlap:g}; network: intra {settings.intra_bandwidth:g} GB/s + "
        f"{settings.intra_latency_us:g} us, inter {settings.inter_bandwidth:g} GB/s per node + "
        f"{settings.inter_latency_us:g} us; time to train {settings.time_to_train_sequences:,.0f} sequences."
    )
    gpus = [row.get("gpus") for row in rows]
    # The layouts' predictions are points (markers, not joined: between two layouts the model is no straight line
    # on these axes); linear scaling is drawn at many GPU counts, so it is the curve it is.
    dense = numpy.geomspace(gpus[0], gpus[-1], 200) if gpus[-1] > gpus[0] else numpy.asarray(gpus, dtype=float)
    label = f"overlap {settings.overlap:g}"
    plots = {
        "efficiency": line_plot(
            {label: (gpus, [row.median("efficiency") for row in rows])},
            "GPUs",
            "scaling efficiency",
            f"{model} {kind}: predicted efficiency",
            log_x=True,
            reference=(gpus, [1.0] * len(gpus), "compute-bound (all hidden)"),
            joined=False,
            y_from_zero=True,
        ),
        "throughput": line_plot(
            {label: (gpus, [row.median() for row in rows])},
            "GPUs",
            "sequences/s",
            f"{model} {kind}: predicted throughput",
            log_x=True,
            log_y=True,
            reference=(dense, dense * batch / compute.median, "linear"),
            joined=False,
        ),
    }
    noisy = noisy_warning([(source, compute)], "measured step")
    return rows, context, f"{title}\n\n{table(rows, PLAN_COLUMNS)}", plots, noisy


def run(settings: PlanSettings, argv: list[str]) -> None:
    output = BenchOutput(settings.directory, "plan", argv, settings.overwrite)
    rows: list[Row] = []
    context: dict[str, Any] = {}
    sections: list[str] = []
    plots: Mapping[str, Any] = {}
    if settings.step_seconds is not None or settings.from_throughput is not None:
        rows, context, markdown, plots, noisy = plan(settings)
        sections.append(markdown)
        output.warn(noisy)
    if settings.validate is not None:
        validation, validation_context, measured_warnings = validate(settings)
        rows += validation
        context["validation"] = validation_context
        sections.append(
            f"Validation against {settings.validate} (alpha and bus bandwidth fitted there; error = predicted - "
            f"measured efficiency; --overlap {settings.overlap:g}):\n\n{table(validation, VALIDATION_COLUMNS)}"
        )
        for message in measured_warnings:
            output.warn(f"{settings.validate} says: {message}")
        output.warn(
            superlinear_warning(
                [{"efficiency": row.median("measured_efficiency"), **row.setting} for row in validation],
                "efficiency",
                lambda row: f"{row['processes']} processes of {row['model']}",
            )
        )
    notes = [note for note in (noisy_ratios_note(rows),) if note]
    markdown = "\n\n".join(sections + notes)
    output.write_result(settings, rows, context, markdown, plots)
    print(with_warnings(markdown, output.warnings))


main = bench_settings.main_for(PlanSettings, description(__doc__), run)
