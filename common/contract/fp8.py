"""What the FP8 rungs share: the reference quantiser, V's layouts, FA3's input distribution, and the
fp64 emulation that judges them.

Quantisation (``Quantisation``, ``quantise``)
---------------------------------------------
Q, K and V are rounded to e4m3 after dividing by a scale that maps a group's amax onto 448 (e4m3's
largest finite value). ``quantise`` is the torch reference; on a GPU the rungs run the fused
quantiser of ``triton_impl.fp8_quantiser`` (the same values, one kernel launch for Q, K and V,
written in the kernel's layout: ``KernelOperands``). Two choices, the same in every stack:

* Scale granularity. Per tensor: one scale for all of Q (K, V). Per block (FlashAttention-3's
  block quantisation): one scale per ``q_block_rows`` rows of Q and per ``kv_block_rows`` rows of K
  and of V, per (batch, head). The blocks match the kernels' tiles (64 query rows: one Triton CTA,
  one CuTe consumer warpgroup; 128 keys: one key block), so each scale is a scalar where it is
  applied: Q's folds into the softmax scale of the tile, K's multiplies the scores of its key block
  before the running max (a positive factor, so the max commutes with it), V's multiplies that
  block's fp32 P V partial when it is added to O. A block whose values are small is no longer
  rounded on the scale of the tensor's largest outlier, so its relative rounding error stays at
  e4m3's 2^-4 instead of growing with the outlier's size.
* Incoherent processing (``rotation``): Q and K multiplied by one random orthogonal matrix
  (Hadamard times random signs, ``random_hadamard``) before quantising. Q Kᵀ is unchanged in exact
  arithmetic, but an outlier channel is spread over all D channels, so the amax that sets each
  scale drops and the other entries keep more bits.

``results/h200/fp8_error.md`` (``python -m common.tools.fp8_error``, FA3's Table 3 experiment) measures
what each buys on FA3's input distribution (``fa3_inputs``).

V's layout (``ValueLayout``, ``transposed_values``) and key order (``value_operand``)
-----------------------------------------------------------------------------------
Every fp8 kernel reads V transposed (Vᵀ, keys contiguous, padded with zeros to a multiple of 16
keys or of its key block): fp8 wgmma reads a shared-memory B operand only K-major.

An e4m3 wgmma's A operand from registers (P in O += P V, k = 32 per instruction) wants each lane to
hold four consecutive k per register, while the accumulator of S = Q Kᵀ gives lane t, per group of
16 keys, the keys 2t, 2t+1, 2t+8 and 2t+9. Kernels that take P straight from S's registers (cute/fp8,
gluon/fp8) rename the registers instead of exchanging data across lanes, and read V with its keys
permuted the same way inside each group of 16 (``PERMUTED_KEY_ORDER``). The product is the same
sum in another order inside each 32-key group, which the emulation's per-group bound already covers.

The emulation (``emulate``)
---------------------------
The yardstick of an fp8 rung is the float64 attention of exactly what its kernel reads (the same
e4m3 bytes and scales: each rung's ``emulate`` quantises with the kernel's own quantiser and
undoes V's layout, ``KernelOperands.as_quantised``) with P rounded to e4m3 the way the kernel
rounds it: P = 2^(s - m_b + 8), where s is the score in log2 units and m_b the running row maximum
after key block b in the kernel's visiting order (both kernels move the maximum on every increase),
rounded to e4m3 for the P V product, while the row sum adds the unrounded P. O is the sum over
blocks of the rounded P V, rescaled to the final maximum, over that row sum, rounded to bf16 as the
kernels write it.

``emulate`` also returns an elementwise bound on |kernel - emulation|, derived from what the
kernel does in finite precision that the emulation does exactly:

* Tensor-core accumulation (``mma_error``). An fp8 wgmma adds the products of each k-group of
  ``MMA_K`` = 32 aligned to the largest of them, keeping about 14 bits (DeepSeek-V3, section 3.3.2,
  measured this on H800): each term loses up to ``MMA_TRUNCATION`` = 2^-13 of the group's largest
  product, one-sided (truncation), so a group can be off by 32 x 2^-13 = 2^-8 of its largest
  product, bounded here by 2^-8 of the group's L2 norm. Adding each group's sum to the accumulator
  loses up to 2^-13 of the sum of |products| so far, once per group.
  A single outlier product (FA3's inputs) therefore costs its whole group up to 2^-8 of the
  outlier: a bound proportional to the sum of |products| alone was exceeded up to 21x on the H200.
* The scores: that error on Q8 K8ᵀ, plus exp2's argument rounded to fp32 and evaluated
  approximately (``EXP2_EPS``), is a score error δ (log2 units, doubled because the running max
  carries the same error), which can move P across an e4m3 rounding boundary: the bound adds, for
  each key, how far the rounded P moves when P is scaled by 2^±δ, times |v|.
* P V: the same accumulation error on each block's P8 V8.
* The row sum of unrounded P carries P's relative error (δ ln 2), and the kernel's fp32 O can round
  to the neighbouring bf16 value (``OUTPUT_EPS``: one ulp).

How close the kernels come to this bound on the H200: ``bound_ratio`` in
``results/h200/fp8_error.csv`` and ``docs/perf-log.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from common.contract.devices import lasting
from common.contract.problem import Problem
from common.contract.reference import sequence_lengths, visible_keys_mask

# Largest finite e4m3 value: scales map each group's amax onto it.
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
# Both kernels compute P = 2^(s - m + P_EXPONENT): P spans [0, 2^8], clear of e4m3's subnormals (< 2^-6).
P_EXPONENT = 8.0
# Quantisation blocks: one CTA's (Triton) or one consumer warpgroup's (CuTe) query rows, one key block.
Q_BLOCK_ROWS = 64
KV_BLOCK_ROWS = 128

# FA3's Table 3 inputs: N(0, 1) + N(0, 100) * Bernoulli(0.001) in Q, K and V.
FA3_OUTLIER_PROBABILITY = 1e-3
FA3_OUTLIER_STD = 10.0

# fp8 wgmma accumulation (module docstring): k-groups of MMA_K products, each product truncated to
# MMA_TRUNCATION of the group's largest (DeepSeek-V3, section 3.3.2: about 14 bits kept on H800).
MMA_K = 32
MMA_TRUNCATION = 2.0**-13
# ex2.approx.f32 (relative 2^-22) and fp32 rounding of exp2's argument (relative 2^-24 of |argument|).
EXP2_EPS = 2.0**-21
FP32_EPS = 2.0**-24
# Both kernels write O in bf16, and so does the emulation; where the kernel's fp32 O lies near a
# rounding midpoint the two can round apart by one bf16 ulp, at most 2^-7 of |O|.
OUTPUT_EPS = 2.0**-7
OUTPUT_DTYPE = torch.bfloat16
# fp64 scores held at once by the emulation: QUERY_CHUNK x Sk per (batch, head).
QUERY_CHUNK = 1024
# The kernels' LSE in fp32: row max + log2(row sum) (a sum rounded once per key block and once per
# level of each block's tree), times ln 2, each rounding relative 2^-24; LSE_ROUNDINGS more cover the
# row max's and the product's own rounding and log2's approximation.
LSE_ROUNDINGS = 8


# ----------------------------------------------------------------------------------------------------
# Quantisation
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantisation:
    """How Q, K, V become e4m3: per-tensor or per-block scales, with or without a Hadamard rotation."""

    block: bool = True
    rotation: bool = True
    q_block_rows: int = Q_BLOCK_ROWS
    kv_block_rows: int = KV_BLOCK_ROWS
    seed: int = 0

    @property
    def name(self) -> str:
        """``per-tensor``, ``block``, ``rotation`` or ``block+rotation`` (the results' variant column)."""
        parts = (["block"] if self.block else []) + (["rotation"] if self.rotation else [])
        return "+".join(parts) or "per-tensor"

    def describe(self) -> str:
        scales = (
            f"block scales ({self.q_block_rows} Q rows, {self.kv_block_rows} K/V rows)"
            if self.block
            else "per-tensor scales"
        )
        rotation = f", Hadamard rotation of Q, K (seed {self.seed})" if self.rotation else ""
        return f"e4m3, {scales}{rotation}"


VARIANTS = {
    variant.name: variant
    for variant in (
        Quantisation(block=False, rotation=False),
        Quantisation(block=True, rotation=False),
        Quantisation(block=False, rotation=True),
        Quantisation(block=True, rotation=True),
    )
}


def quantisation_named(name: str) -> Quantisation:
    if name not in VARIANTS:
        raise ValueError(f"unknown fp8 quantisation {name!r}; valid: {', '.join(VARIANTS)}")
    return VARIANTS[name]


@dataclass(frozen=True)
class QuantisedOperands:
    """e4m3 Q, K, V (B, H, S, D) and fp32 scales per (B, H, block): value = e4m3 x scale of its block.
    Per-tensor quantisation fills every block of a tensor with the one scale."""

    q8: torch.Tensor
    k8: torch.Tensor
    v8: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    quantisation: Quantisation


def random_hadamard(head_dim: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(D, D) orthogonal fp32 matrix H diag(s) / sqrt(D): Sylvester's Hadamard H, random signs s.

    Built once per (D, seed, device) and shared (callers must not modify it): building it on the host
    and copying it to the GPU in every call would make each call wait for the work queued before it.
    """
    return _random_hadamard(head_dim, seed, torch.device(device))


@functools.cache
def _random_hadamard(head_dim: int, seed: int, device: torch.device) -> torch.Tensor:
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < head_dim:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (head_dim,), generator=generator, dtype=torch.float64) * 2 - 1
    return lasting(lambda: (hadamard * signs[None, :] / math.sqrt(head_dim)).float().to(device), device)


def block_scales(x: torch.Tensor, block_rows: int, per_block: bool) -> torch.Tensor:
    """fp32 (B, H, ceil(S / block_rows)) scales amax / E4M3_MAX; an all-zero group gets scale 1."""
    batch, heads, seqlen, head_dim = x.shape
    blocks = -(-seqlen // block_rows)
    if per_block:
        padded = torch.nn.functional.pad(x.abs(), (0, 0, 0, blocks * block_rows - seqlen))
        amax = padded.view(batch, heads, blocks, block_rows * head_dim).amax(dim=-1).float()
    else:
        amax = x.abs().amax().float().expand(batch, heads, blocks)
    # Divide by a tensor, not a Python scalar: PyTorch's CUDA division by a scalar multiplies by its
    # reciprocal (1 / 448 is inexact), which moves 1 scale in ~10 by an ulp against the CPU's division.
    divisor = torch.full_like(amax, E4M3_MAX)
    return torch.where(amax > 0, amax / divisor, torch.ones_like(amax)).contiguous()


def quantise_with(x: torch.Tensor, scales: torch.Tensor, block_rows: int) -> torch.Tensor:
    """x / (its block's scale) in e4m3, (B, H, S, D) contiguous."""
    row_scale = scales.repeat_interleave(block_rows, dim=-1)[..., : x.shape[2], None]
    # amax / (amax / 448) may round a hair past 448: saturate, as torch's CUDA cast would give NaN.
    return (x.float() / row_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, quantisation: Quantisation) -> QuantisedOperands:
    """Rotate Q and K (if asked), then scale and round Q, K, V to e4m3 (see the module docstring)."""
    if quantisation.rotation:
        rotation = random_hadamard(q.shape[-1], quantisation.seed, q.device)
        q, k = q.float() @ rotation, k.float() @ rotation
    rows = (quantisation.q_block_rows, quantisation.kv_block_rows, quantisation.kv_block_rows)
    scales = [block_scales(t, r, quantisation.block) for t, r in zip((q, k, v), rows, strict=True)]
    q8, k8, v8 = (quantise_with(t, s, r) for t, s, r in zip((q, k, v), scales, rows, strict=True))
    return QuantisedOperands(q8, k8, v8, *scales, quantisation)


def dequantised(x8: torch.Tensor, scales: torch.Tensor, block_rows: int) -> torch.Tensor:
    """float64 values the kernel multiplies: e4m3 x its block's scale."""
    row_scale = scales.double().repeat_interleave(block_rows, dim=-1)[..., : x8.shape[2], None]
    return x8.double() * row_scale


# ----------------------------------------------------------------------------------------------------
# V as the B operand of P V, keys permuted (``value_operand``)
# ----------------------------------------------------------------------------------------------------
# Keys per permutation group: one 16-wide half of the 32-wide FP8 k-block.
KEY_GROUP = 16
# Slot s = 4 t + i of a key group (lane t's four consecutive k) holds key 8 (i // 2) + 2 t + i % 2,
# the key whose score lane t holds in accumulator register i of that group.
PERMUTED_KEY_ORDER = tuple(8 * ((slot % 4) // 2) + 2 * (slot // 4) + slot % 2 for slot in range(KEY_GROUP))


@functools.cache
def _key_order(device: torch.device) -> torch.Tensor:
    """``PERMUTED_KEY_ORDER`` on ``device``, copied once: a copy per call would wait for queued work."""
    return lasting(lambda: torch.tensor(PERMUTED_KEY_ORDER, device=device), device)


@dataclass(frozen=True)
class ValueLayout:
    """How a kernel reads V: transposed, (B, Hkv, D, Sk') with keys contiguous (fp8 wgmma reads its
    shared-memory B operand K-major only), Sk' = Sk rounded up to ``key_multiple`` with real zeros,
    and, if ``permuted``, the keys of each group of 16 in ``PERMUTED_KEY_ORDER``."""

    permuted: bool
    key_multiple: int = KEY_GROUP

    def __post_init__(self) -> None:
        if self.key_multiple < KEY_GROUP or self.key_multiple % KEY_GROUP:
            raise ValueError(f"key_multiple must be a multiple of {KEY_GROUP}, got {self.key_multiple}")

    def padded_keys(self, seqlen_k: int) -> int:
        return -(-seqlen_k // self.key_multiple) * self.key_multiple


def _slot_keys(padded: int, layout: ValueLayout, device: torch.device) -> torch.Tensor:
    """The key each of the ``padded`` slots of Vᵀ holds."""
    slots = torch.arange(padded, device=device)
    if not layout.permuted:
        return slots
    return (slots.view(-1, KEY_GROUP)[:, :1] + _key_order(device)).flatten()


def transposed_values(v8: torch.Tensor, layout: ValueLayout) -> torch.Tensor:
    """(B, H, Sk, D) e4m3 -> Vᵀ (B, H, D, Sk') in ``layout`` (contiguous), the torch reference of
    what the fused quantiser writes.

    The padding is real zeros, not out-of-bounds fill: a permuted group can move a key below Sk to a
    slot above it, so kernels must read the whole padded group. A kernel whose key block is
    ``key_multiple`` keys reads no key out of bounds at all.
    """
    batch, heads, seqlen_k, head_dim = v8.shape
    padded = layout.padded_keys(seqlen_k)
    # e4m3 has no torch kernels for indexing or padding: move the bytes as uint8.
    v_bytes = torch.zeros((batch, heads, padded, head_dim), dtype=torch.uint8, device=v8.device)
    v_bytes[:, :, :seqlen_k] = v8.view(torch.uint8)
    keys = _slot_keys(padded, layout, v8.device)
    return v_bytes[:, :, keys].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)


def values_in_rows(vt8: torch.Tensor, layout: ValueLayout, seqlen_k: int) -> torch.Tensor:
    """The inverse of ``transposed_values``: Vᵀ in ``layout`` back to (B, H, Sk, D) e4m3."""
    padded = vt8.shape[-1]
    slots = torch.empty(padded, dtype=torch.long, device=vt8.device)
    slots[_slot_keys(padded, layout, vt8.device)] = torch.arange(padded, device=vt8.device)
    rows = vt8.view(torch.uint8).transpose(2, 3)[:, :, slots[:seqlen_k]]
    return rows.contiguous().view(torch.float8_e4m3fn)


def value_operand(v8: torch.Tensor, key_multiple: int = KEY_GROUP) -> torch.Tensor:
    """V as cute/fp8 and gluon/fp8 read it: transposed, zero-padded to ``key_multiple`` keys, keys
    permuted per group by ``PERMUTED_KEY_ORDER`` (the module docstring says why)."""
    return transposed_values(v8, ValueLayout(permuted=True, key_multiple=key_multiple))


@dataclass(frozen=True)
class KernelOperands:
    """What an fp8 kernel reads: Q8 (B, H, Sq, D) and K8 (B, Hkv, Sk, D) e4m3, Vᵀ8 in
    ``value_layout``, and the fp32 scales (B, H or Hkv, blocks) of ``QuantisedOperands``."""

    q8: torch.Tensor
    k8: torch.Tensor
    vt8: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    quantisation: Quantisation
    value_layout: ValueLayout

    @property
    def seqlen_k(self) -> int:
        return self.k8.shape[2]

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The six buffers in field order, e4m3 ones seen as bytes (views: writing one writes the buffer)."""
        tensors = (self.q8, self.k8, self.vt8, self.q_scale, self.k_scale, self.v_scale)
        return tuple(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in tensors)

    def poison_(self) -> None:
        """NaN in every buffer (e4m3's 0x7F bytes, fp32 scales): a tile that no program writes then
        fails any comparison."""
        for tensor in self.buffers():
            tensor.fill_(0x7F if tensor.dtype == torch.uint8 else float("nan"))

    def as_quantised(self) -> QuantisedOperands:
        """The same bytes and scales with V in rows again: the emulation's input."""
        v8 = values_in_rows(self.vt8, self.value_layout, self.seqlen_k)
        return QuantisedOperands(self.q8, self.k8, v8, self.q_scale, self.k_scale, self.v_scale, self.quantisation)


def kernel_operands(operands: QuantisedOperands, layout: ValueLayout) -> KernelOperands:
    """The torch quantiser's operands in a kernel's layout: the reference for the fused quantiser."""
    vt8 = transposed_values(operands.v8, layout)
    return KernelOperands(
        operands.q8, operands.k8, vt8, operands.q_scale, operands.k_scale, operands.v_scale, operands.quantisation,
        layout,
    )  # fmt: skip


def fa3_inputs(
    problem: Problem, seed: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-3's Table 3 distribution: N(0, 1) + N(0, 100) x Bernoulli(0.001), for Q (B, H, Sq, D)
    and K and V (B, Hkv, Sk, D) (the problem's KV heads: GQA and MQA draw fewer K/V heads than Q's)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for heads, seqlen in ((problem.heads, problem.seqlen_q), (problem.kv_heads, problem.seqlen_k),
                          (problem.kv_heads, problem.seqlen_k)):  # fmt: skip
        shape = (problem.batch, heads, seqlen, problem.head_dim)
        base = torch.randn(shape, generator=generator)
        outlier = torch.randn(shape, generator=generator) * FA3_OUTLIER_STD
        hit = torch.rand(shape, generator=generator) < FA3_OUTLIER_PROBABILITY
        tensors.append((base + outlier * hit).to(device=device, dtype=problem.dtype))
    return tuple(tensors)


# ----------------------------------------------------------------------------------------------------
# Emulation
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Emulation:
    """O of the emulated kernel (computed in float64, rounded to the kernels' bf16 output) and the
    elementwise bound on |kernel O - emulated O|; the natural-log LSE (B, H, Sq) of the quantised
    scores (-inf where a row sees no key) and the bound on |kernel lse - emulated lse|."""

    out: torch.Tensor
    bound: torch.Tensor
    lse: torch.Tensor | None = None
    lse_bound: torch.Tensor | None = None


def round_p(p: torch.Tensor) -> torch.Tensor:
    """P (float64) as the kernel rounds it: to fp32 (where exp2 computes it), then to e4m3, saturating
    like the kernels' ``cvt.rn.satfinite`` (torch's CUDA cast turns values past 448 into NaN)."""
    return p.float().clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).double()


@dataclass(frozen=True)
class KernelOrder:
    """What the emulation must copy from a kernel: key-block size and visiting order of the online softmax."""

    block_n: int
    reverse: bool


def _emulate_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    first_row: int,
    sequence_keys: int,
    problem: Problem,
    order: KernelOrder,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Emulated O, its bound, the LSE and its bound for query rows [first_row, first_row + len) of one
    (batch, head) whose sequence has ``sequence_keys`` valid keys of the padded ``k.shape[0]``."""
    seqlen_k = k.shape[0]
    scale_log2 = problem.scale / math.log(2.0)
    s = (q @ k.T) * scale_log2
    s_error = mma_error(q, k.T, q.shape[-1]) * scale_log2
    rows = torch.arange(first_row, first_row + q.shape[0], device=q.device)
    # The problem's mask (reference.py): sequence length, causal diagonal in either alignment.
    visible = visible_keys_mask(problem, sequence_keys, rows, seqlen_k, q.device)
    s = s.masked_fill(~visible, -math.inf)

    # Running max in the kernel's block order; every key takes the max of its own block's step.
    blocks = -(-seqlen_k // order.block_n)
    padded = torch.nn.functional.pad(s, (0, blocks * order.block_n - seqlen_k), value=-math.inf)
    block_max = padded.view(s.shape[0], blocks, order.block_n).amax(dim=-1)
    running = block_max.flip(-1).cummax(dim=-1).values.flip(-1) if order.reverse else block_max.cummax(dim=-1).values
    final_max = running[:, 0] if order.reverse else running[:, -1]
    key_max = running.repeat_interleave(order.block_n, dim=-1)[:, :seqlen_k]
    # Rows with no visible key in a block's step so far subtract 0 (the kernels' guard), giving P = 0.
    key_max = torch.where(torch.isfinite(key_max), key_max, torch.zeros_like(key_max))

    exponent = s - key_max + P_EXPONENT
    p = torch.exp2(exponent)
    p8 = round_p(p)
    # Undo each step's reference: the kernels' alpha factors, exact here.
    to_final = torch.exp2(key_max - final_max[:, None]).masked_fill(~visible, 0.0)
    row_sum = (p * to_final).sum(dim=-1, keepdim=True)
    # A row that sees no key (row sum 0) is 0, as the kernels write it, not 0 / 0.
    has_keys = row_sum > 0
    row_sum = torch.where(has_keys, row_sum, torch.ones_like(row_sum))
    out = ((p8 * to_final) @ v) / row_sum

    # Bound (module docstring): score error in log2 units, twice for the running max's own error.
    delta = 2 * (s_error + EXP2_EPS + FP32_EPS * (exponent.abs() + key_max.abs())).masked_fill(~visible, 0.0)
    delta = delta.amax(dim=-1, keepdim=True)
    flip = torch.maximum((round_p(p * torch.exp2(delta)) - p8).abs(), (round_p(p * torch.exp2(-delta)) - p8).abs())
    pv_error = mma_error(p8 * to_final, v, order.block_n)
    bound = ((flip * to_final) @ v.abs() + pv_error) / row_sum + (OUTPUT_EPS + delta * math.log(2.0)) * out.abs()

    # LSE: the kernels' (row_max + log2(row_sum) - P_EXPONENT) · ln 2 equals the log-sum-exp of the
    # quantised scores; it moves with them by at most delta (log2 units), plus its fp32 roundings.
    has_keys = has_keys[:, 0]
    lse = ((final_max + torch.log2(row_sum[:, 0]) - P_EXPONENT) * math.log(2.0)).masked_fill(~has_keys, -math.inf)
    roundings = blocks + math.log2(order.block_n) + LSE_ROUNDINGS
    lse_bound = delta[:, 0] * math.log(2.0) + roundings * FP32_EPS * (lse.abs() + 1.0)
    return out, bound, lse, lse_bound.masked_fill(~has_keys, 0.0)


def mma_error(a: torch.Tensor, b: torch.Tensor, accumulated: int) -> torch.Tensor:
    """Bound on |fp8-wgmma(a @ b) - a @ b| (module docstring): per k-group of MMA_K products 2^-8 of
    their L2 norm, plus MMA_TRUNCATION of the sum of |products| for each group added to an
    accumulator that runs over ``accumulated`` k (one wgmma chain; longer sums add in fp32)."""
    rows, depth = a.shape
    groups = depth // MMA_K
    padded = groups * MMA_K
    grouped_a = a[:, :padded].square().reshape(rows, groups, MMA_K)
    grouped_b = b[:padded].square().reshape(groups, MMA_K, b.shape[-1])
    within = torch.einsum("rgk,gkc->rgc", grouped_a, grouped_b).sqrt().sum(dim=1) * (MMA_K * MMA_TRUNCATION)
    if padded < depth:
        within = within + (a[:, padded:].square() @ b[padded:].square()).sqrt() * (MMA_K * MMA_TRUNCATION)
    across = (a.abs() @ b.abs()) * (MMA_TRUNCATION * accumulated / MMA_K)
    return within + across


def emulate(
    operands: QuantisedOperands,
    problem: Problem,
    order: KernelOrder,
    cache_seqlens: torch.Tensor | None = None,
) -> Emulation:
    """float64 attention of the quantised operands with P rounded as a kernel visiting key blocks of
    ``order.block_n`` in ``order`` rounds it, and the bound on the kernel's distance to it. The
    problem's conventions hold as in ``reference.py``: query head h reads KV head ``problem.kv_head(h)``
    (K and V quantised per KV head), the causal alignment, and ``cache_seqlens`` (when the problem
    carries them) as each sequence's key length."""
    quantisation = operands.quantisation
    q = dequantised(operands.q8, operands.q_scale, quantisation.q_block_rows)
    k = dequantised(operands.k8, operands.k_scale, quantisation.kv_block_rows)
    v = dequantised(operands.v8, operands.v_scale, quantisation.kv_block_rows)
    lengths = sequence_lengths(problem, cache_seqlens)
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    bound = torch.empty_like(out)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    lse_bound = torch.empty_like(lse)
    for b in range(problem.batch):
        for h in range(problem.heads):
            kv_head = problem.kv_head(h)
            for start in range(0, problem.seqlen_q, QUERY_CHUNK):
                rows = slice(start, min(start + QUERY_CHUNK, problem.seqlen_q))
                out[b, h, rows], bound[b, h, rows], lse[b, h, rows], lse_bound[b, h, rows] = _emulate_rows(
                    q[b, h, rows], k[b, kv_head], v[b, kv_head], start, lengths[b], problem, order
                )
    return Emulation(out.to(OUTPUT_DTYPE).double(), bound, lse, lse_bound)
