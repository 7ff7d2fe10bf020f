"""The unpadded path's layout: the real tokens of a padded [batch, seq] batch packed into [rows], made once per batch
on the host, from the attention mask on the CPU, before the batch goes to its device.

A `Packing` holds what the model needs to run a batch on its real tokens only (MosaicBERT's unpadding, the packed
input of NVIDIA's MLPerf BERT): each row's place in the padded batch (`indices`), its position in its sequence, the
cumulative sequence lengths of variable-length attention (`cu_seqlens`) and the longest sequence, with the sizes the
kernels need as Python ints. Made on the CPU, these travel with the batch (pinned, copied without blocking) and a
forward makes no host sync for them; a model called with only a device mask makes its own, paying the sync.

`kernel` says how the model runs the batch: an attention kernel of the unpadded path, or None for the padded path
(every sequence computed at the batch's length), decided on the host by the model's `Packer` from the batch's
padding, by the model's `PathRule` (which bertbench.model.attention.path_rule picks for a device).

With `bucketed`, the rows are padded up to one of a few sizes (NVIDIA's MLPerf code pads its packed token count the
same way), so that a CUDA graph captured for a size replays for every batch of that bucket: the extra rows form
sequences of their own (of at most `seq_length` tokens each, in a fixed number of slots), so that attention and
every row-wise layer compute finite values there, and nothing reads them back (`unpack` drops them, and their
gradients are zero). `max_seqlen` is then the batch's length, the same for every batch of the bucket.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

# Buckets per doubling of the token count: a batch's packed rows are rounded up to a multiple of 1/8 of the power
# of two below them, so at most 12.5% of the rows (3-6% on average) are bucket padding, and a stream of batches of
# varying lengths visits a handful of sizes (each one CUDA graph).
BUCKETS_PER_OCTAVE = 8
MIN_BUCKET_STEP = 8  # rows in multiples of 8 at least: the matmuls' tensor-core tiles


def bucket_rows(tokens: int) -> int:
    """The bucketed row count for `tokens` real tokens (see BUCKETS_PER_OCTAVE)."""
    if tokens <= 0:
        return MIN_BUCKET_STEP
    step = max(MIN_BUCKET_STEP, 2 ** (tokens.bit_length() - 1) // BUCKETS_PER_OCTAVE)
    return math.ceil(tokens / step) * step


def filler_slots(rows: int, seq_length: int) -> int:
    """Sequences kept for a bucket's filler rows: enough for the most a bucket of `rows` can have (under 1/8 of
    them), each of at most seq_length tokens; a fixed number per bucket, so that cu_seqlens has one shape."""
    return max(1, math.ceil(rows / BUCKETS_PER_OCTAVE / seq_length))


@dataclasses.dataclass
class Packing:
    """A batch's real tokens as rows (see the module's docstring). Tensors are on the batch's device; the ints are
    host values, read without a sync."""

    batch: int
    seq_length: int
    tokens: int  # real tokens
    kernel: str | None  # the unpadded path's attention kernel; None: the batch runs padded
    indices: torch.Tensor | None = None  # [rows] int64: each row's place in the flattened batch; batch*seq: filler
    positions: torch.Tensor | None = None  # [rows] int64: each row's position in its sequence
    cu_seqlens: torch.Tensor | None = None  # [sequences + 1] int32: where each sequence's rows start
    mask: torch.Tensor | None = None  # [batch, seq] bool: the attention mask
    lengths: tuple[int, ...] = ()  # real tokens per sequence
    max_seqlen: int = 0  # the attention kernels' bound on a sequence's length
    width: int = 0  # columns up to every sequence's last real token (the masked kernel's batch length)
    bucketed: bool = False

    @property
    def rows(self) -> int:
        """Packed rows: the real tokens, plus a bucket's filler rows."""
        return self.tokens if self.indices is None else len(self.indices)

    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def padding_share(self) -> float:
        return 1 - self.tokens / (self.batch * self.seq_length)

    @classmethod
    def padded(cls, mask: torch.Tensor, tokens: int | None = None) -> Packing:
        """A batch that runs padded: only its sizes (the padded path skips its mask when nothing is padding)."""
        batch, seq_length = mask.shape
        tokens = int(mask.sum()) if tokens is None else tokens
        return cls(batch, seq_length, tokens, None, mask=mask.bool())

    @classmethod
    def of_mask(
        cls, mask: torch.Tensor, kernel: str, bucketed: bool = False, lengths: torch.Tensor | None = None
    ) -> Packing:
        """The packing of a [batch, seq] 0/1 mask of any shape (each row's real tokens are found, not assumed to
        come first), for `kernel`; `lengths`: its real tokens per row, when already counted. On a CPU mask this is
        host work; on a device mask it costs a sync."""
        mask = mask.bool()
        batch, seq_length = mask.shape
        flat_indices = mask.flatten().nonzero().squeeze(1)
        lengths = mask.sum(1) if lengths is None else lengths
        length_list = tuple(lengths.tolist())
        tokens = sum(length_list)
        positions = flat_indices % seq_length
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        columns = mask.any(0).nonzero()
        width = int(columns.max()) + 1 if len(columns) else 1
        max_seqlen = max(length_list, default=0)
        if bucketed:
            rows = bucket_rows(tokens)
            filler = rows - tokens
            slots = filler_slots(rows, seq_length)
            filler_lengths = [max(0, min(seq_length, filler - seq_length * slot)) for slot in range(slots)]
            flat_indices = torch.cat([flat_indices, flat_indices.new_full((filler,), batch * seq_length)])
            positions = torch.cat([positions, positions.new_zeros(filler)])
            cu_seqlens = torch.cat([cu_seqlens, tokens + torch.tensor(filler_lengths).cumsum(0)])
            max_seqlen = seq_length
        return cls(
            batch,
            seq_length,
            tokens,
            kernel,
            flat_indices,
            positions,
            cu_seqlens.int(),
            mask,
            length_list,
            max_seqlen,
            width,
            bucketed,
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Packing:
        return dataclasses.replace(
            self, **{name: value.to(device, non_blocking=non_blocking) for name, value in self.tensors().items()}
        )

    def pin_memory(self) -> Packing:
        return dataclasses.replace(self, **{name: value.pin_memory() for name, value in self.tensors().items()})

    def tensors(self) -> dict[str, torch.Tensor]:
        """The packing's tensors by field name: what moves to a device, and what a CUDA graph reloads."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if isinstance(getattr(self, field.name), torch.Tensor)
        }

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[batch, seq, ...] -> [rows, ...] (a bucket's filler rows read a row of zeros)."""
        flat = padded.flatten(0, 1)
        if self.bucketed:
            flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
        return flat.index_select(0, self.indices)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[rows, ...] -> [batch, seq, ...], zeros at the padding (a bucket's filler rows go to a slot dropped)."""
        slots = self.batch * self.seq_length
        # int(): under torch.compile the slots may be a symbolic size, which torch 2.11 cannot add a bool to.
        flat = packed.new_zeros(slots + int(self.bucketed), *packed.shape[1:]).index_copy(0, self.indices, packed)
        return flat[:slots].view(self.batch, self.seq_length, *packed.shape[1:])

    def narrow_indices(self) -> torch.Tensor:
        """The rows' places in [batch, width] (the masked kernel's layout), computed on the device without a sync."""
        return self.indices // self.seq_length * self.width + self.positions

    def sequence_ids(self) -> torch.Tensor:
        """Each row's sequence (the block-diagonal kernel's mask)."""
        return self.indices // self.seq_length


# "auto" on a CPU: per-sequence for a batch whose longest sequence has at least PER_SEQUENCE_MIN_LENGTH tokens, masked
# for a shorter one, whose sequences' attention is too small to pay for a call each (docs/results/cpu-2core/unpadded).
PER_SEQUENCE_MIN_LENGTH = 64


@dataclasses.dataclass(frozen=True)
class PathRule:
    """How a model runs its batches on a device: the unpadded path's kernel ("auto": by each batch's longest
    sequence) for a batch with at least `min_padding_share` of padding, the padded path below; and why."""

    kernel: str
    min_padding_share: float
    reason: str

    def kernel_for(self, longest: int) -> str:
        if self.kernel != "auto":
            return self.kernel
        return "per-sequence" if longest >= PER_SEQUENCE_MIN_LENGTH else "masked"


@dataclasses.dataclass(frozen=True)
class Packer:
    """Makes each batch's Packing from its attention mask, by a model's PathRule (None: the padded path for every
    batch): a batch with no padding, or less than the rule's share, runs padded; the others on the rule's kernel.
    With `bucketed`, a varlen batch's rows are bucketed (CUDA graphs)."""

    rule: PathRule | None
    bucketed: bool = False

    def __call__(self, attention_mask: torch.Tensor) -> Packing:
        mask = attention_mask.bool()
        lengths = mask.sum(1)
        tokens = int(lengths.sum())
        if self.rule is None or tokens == mask.numel() or tokens > (1 - self.rule.min_padding_share) * mask.numel():
            return Packing.padded(mask, tokens)
        kernel = self.rule.kernel_for(int(lengths.max()))
        return Packing.of_mask(mask, kernel, self.bucketed and kernel == "varlen", lengths)
