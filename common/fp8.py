"""What both FP8 rungs share: the e4m3 range, V's key-permuted operand layout, the input-rounding floor.

Why V's keys are permuted
-------------------------
For O += P V the FP8 WGMMA takes P from registers as its A operand (m64 x k32, e4m3). That layout
gives lane t of a quad the four *consecutive* keys 4t..4t+3 of each 16-key half, but the S
accumulator that P is computed in gives the same lane the key *pairs* 2t, 2t+1, 2t+8, 2t+9. Reading
P's registers as the A operand therefore multiplies slot 4t+i by the key the lane holds in register
i; storing V's keys in that same order (``PERMUTED_KEY_ORDER``) makes the product exact with no
cross-lane shuffle (``cute_impl/_hopper_device.scores_to_operand_a`` renames the registers).

Why the 3e-2 error target is out of reach on standard-normal inputs
-------------------------------------------------------------------
``input_rounding_error`` computes attention in float64 on the e4m3-rounded Q, K, V (exact
softmax, P unrounded) against the unquantised inputs: no kernel that reads e4m3 Q, K, V can do
better. On standard-normal inputs it is about 4.8e-2 (each operand's 2.7 % rounding noise reaches O
undamped when V has zero mean); the kernels, which also round P, measure about 5.3e-2.

Incoherent processing
---------------------
Q Kᵀ = (Q R)(K R)ᵀ for any orthogonal R. With R a Hadamard matrix times random signs
(``random_hadamard``), an outlier entry of Q or K is spread over all D channels before rounding,
which lowers the rounding error of the large scores it would otherwise dominate. Standard-normal
data is unchanged in distribution by a rotation, so there it neither helps nor hurts.
"""

from __future__ import annotations

import math

import torch

from common.problem import Problem
from common.reference import reference_attention

# Injected outliers (``with_outliers``): this share of the entries of Q and K, scaled by this much.
OUTLIER_FRACTION = 1e-3
OUTLIER_MAGNITUDE = 10.0

# Largest finite e4m3 value: scales map each tensor's amax onto it.
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
# Keys per permutation group: one 16-wide half of the 32-wide FP8 k-block.
KEY_GROUP = 16
# Slot s = 4 t + i of a key group (lane t's four consecutive k) holds key 8 (i // 2) + 2 t + i % 2,
# the key whose score lane t holds in accumulator register i of that group.
PERMUTED_KEY_ORDER = tuple(8 * ((slot % 4) // 2) + 2 * (slot // 4) + slot % 2 for slot in range(KEY_GROUP))


def value_operand(v8: torch.Tensor) -> torch.Tensor:
    """(B, H, Sk, D) e4m3 -> (B, H, D, Sk') key-contiguous, zero-padded to Sk' = Sk rounded up to 16,
    keys permuted per group by ``PERMUTED_KEY_ORDER``.

    The padding is real zeros, not out-of-bounds fill: a permuted group can move a key below Sk to a
    slot above it, so kernels must read the whole padded group.
    """
    batch, heads, seqlen_k, head_dim = v8.shape
    padded = -(-seqlen_k // KEY_GROUP) * KEY_GROUP
    order = torch.tensor(PERMUTED_KEY_ORDER, device=v8.device)
    keys = (torch.arange(padded // KEY_GROUP, device=v8.device)[:, None] * KEY_GROUP + order).flatten()
    # e4m3 has no torch kernels for indexing or padding: move the bytes as uint8.
    v_bytes = torch.zeros((batch, heads, padded, head_dim), dtype=torch.uint8, device=v8.device)
    v_bytes[:, :, :seqlen_k] = v8.view(torch.uint8)
    return v_bytes[:, :, keys].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)


def round_to_e4m3(x: torch.Tensor, per_head: bool) -> torch.Tensor:
    """x quantised to e4m3 (amax -> E4M3_MAX, per tensor or per (batch, head)) and scaled back, fp64."""
    amax = x.abs().amax(dim=(-2, -1), keepdim=True) if per_head else x.abs().amax()
    scale = torch.where(amax > 0, amax.double() / E4M3_MAX, torch.ones_like(amax, dtype=torch.float64))
    return (x.double() / scale).to(torch.float8_e4m3fn).double() * scale


def random_hadamard(head_dim: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """(D, D) orthogonal fp32 matrix H diag(s) / sqrt(D): Sylvester's Hadamard H, random signs s."""
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < head_dim:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (head_dim,), generator=generator, dtype=torch.float64) * 2 - 1
    return (hadamard * signs[None, :] / math.sqrt(head_dim)).float().to(device)


def with_outliers(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A copy of ``x`` with ``OUTLIER_FRACTION`` of its entries scaled by ``OUTLIER_MAGNITUDE``."""
    generator = torch.Generator().manual_seed(seed)
    hit = torch.rand(x.shape, generator=generator) < OUTLIER_FRACTION
    return torch.where(hit.to(x.device), x * OUTLIER_MAGNITUDE, x)


def input_rounding_error(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    per_head: bool = False,
    rotation: torch.Tensor | None = None,
) -> float:
    """Relative L2 error of exact attention on e4m3-rounded Q, K, V: the floor for any e4m3 kernel.

    With ``rotation``, Q and K are rotated before rounding (the result is still compared with the
    unrotated exact attention, which the rotation leaves unchanged).
    """
    exact = reference_attention(q, k, v, problem)
    if rotation is not None:
        q, k = (t.double() @ rotation.double() for t in (q, k))
    rounded = reference_attention(*(round_to_e4m3(t, per_head) for t in (q, k, v)), problem)
    return ((rounded - exact).norm() / exact.norm()).item()
