"""The fused FP8 quantiser (``triton_impl.fp8_quantiser``) against the torch reference
(``common.contract.fp8.quantise`` in each kernel's layout): on CPU under the Triton interpreter with
small shapes, on the GPU at real ones; planted bugs the comparison must catch; the sm_90a builds."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton
import triton.language as tl

from common.contract import fp8
from common.contract.capability import SM90_SHARED_MEMORY_BYTES
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from tests._helpers import json_from_child
from triton_impl import fp8_launch
from triton_impl import fp8_quantiser as fused
from triton_impl import fp8_quantiser_kernel as kernel

# Elements per program of the division tests' kernel.
DIVISION_BLOCK = 1 << 16
# The three kernels' V layouts: triton/fp8 (key order), cute/fp8 (permuted, 16), gluon/fp8 (permuted, 128).
LAYOUTS = {
    "triton": fp8.ValueLayout(permuted=False, key_multiple=16),
    "cute": fp8.ValueLayout(permuted=True, key_multiple=16),
    "gluon": fp8.ValueLayout(permuted=True, key_multiple=128),
}
# (variant, rotation method): the method matters only with a rotation.
CASES = [
    ("per-tensor", "tensor_core"),
    ("block", "tensor_core"),
    ("rotation", "tensor_core"),
    ("rotation", "butterfly"),
    ("block+rotation", "tensor_core"),
    ("block+rotation", "butterfly"),
    ("rotation", "kronecker"),
    ("block+rotation", "kronecker"),
]


def _problem(head_dim: int, dtype: torch.dtype, seqlens: tuple[int, int] = (130, 100)) -> Problem:
    """GQA (2 query heads over 1 KV head), two sequences, ragged in every block size."""
    return Problem(2, 2, *seqlens, head_dim, dtype=dtype, kv_heads=1)


@functools.cache
def _inputs(problem: Problem, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FA3's outlier inputs with an offset on V: outliers set amaxes, the offset makes V's signs uneven.
    Drawn once per problem (at P1 the draw takes seconds); callers do not modify them."""
    q, k, v = fp8.fa3_inputs(problem, seed=problem.seqlen_q + problem.head_dim, device=device)
    return q, k, v + 0.5


def _compare(q, k, v, variant: str, method: str, layout: fp8.ValueLayout) -> fused.OperandDifferences:
    quantisation = fp8.quantisation_named(variant)
    operands = fused.quantise_fused(q, k, v, quantisation, layout, method)
    reference = fp8.kernel_operands(fp8.quantise(q, k, v, quantisation), layout)
    return fused.operand_differences(operands, reference)


# ----------------------------------------------------------------------------------------------------
# CPU (interpreter): the same values as the reference
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("variant", "method"), CASES, ids=[f"{v}-{m}" for v, m in CASES])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fused_quantiser_gives_the_reference_bytes_and_scales(
    dtype: torch.dtype, head_dim: int, variant: str, method: str, layout: str
):
    """Bit-identical without rotation (and V always); with it, every difference one e4m3 step on few
    elements and scales within a few ulps (``operand_differences``), in each kernel's layout."""
    differences = _compare(*_inputs(_problem(head_dim, dtype)), variant, method, LAYOUTS[layout])
    print(differences.summary())
    assert differences.ok, differences.summary()
    if not fp8.quantisation_named(variant).rotation:
        assert differences.differing == 0


def test_fused_quantiser_reads_strided_inputs_and_refills_its_buffers():
    """(B, S, H, D) storage seen as (B, H, S, D) is read by strides (no copy), and a second call with
    new inputs rewrites the same buffers with the new values."""
    problem = _problem(64, torch.float16, (77, 150))
    quantisation = fp8.quantisation_named("block+rotation")
    layout = LAYOUTS["cute"]
    quantiser = fused.FusedQuantiser(
        (2, 2, 77, 64), (2, 1, 150, 64), torch.float16, "cpu", quantisation, layout, "butterfly"
    )
    for seed in (1, 2):
        q, k, v = make_inputs(problem, seed=seed, device="cpu", offset=0.5)
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        assert not q.is_contiguous()
        operands = quantiser(q, k, v)
        assert operands.q8.data_ptr() == quantiser.operands.q8.data_ptr()
        reference = fp8.kernel_operands(fp8.quantise(q, k, v, quantisation), layout)
        differences = fused.operand_differences(operands, reference)
        assert differences.ok, differences.summary()


# Configurations that change how the kernel runs (interpreted: the loop over tiles, program ranges,
# launches, prefetching, the division); num_stages, num_warps and maxnreg only matter compiled.
KNOB_CONFIGS = [
    fused.QuantiserConfig(single_launch=False, division="ieee"),
    fused.QuantiserConfig(tiles_per_program=3, prefetch=True),
    fused.QuantiserConfig(single_launch=False, tiles_per_program=2),
    fused.QuantiserConfig(tiles_per_program=4, num_stages=2, division="ieee"),
    fused.QuantiserConfig(programs_per_sm=1, prefetch=True),
    fused.QuantiserConfig(programs_per_sm=1, num_stages=3, tma=True),
    fused.QuantiserConfig(tiles_per_program=3, prefetch=True, interleave=True),
]
# The SM count the knob test's persistent grid sees: 3 programs, so that each walks several tiles of each tensor.
CPU_SM_COUNT = 3


@pytest.mark.parametrize("config", KNOB_CONFIGS, ids=lambda config: config.describe())
@pytest.mark.parametrize(
    ("variant", "layout", "head_dim", "dtype"),
    [
        ("block+rotation", "cute", 64, torch.float16),
        ("per-tensor", "gluon", 64, torch.bfloat16),
        ("block", "triton", 128, torch.float16),
    ],
)
def test_every_knob_writes_the_default_configurations_bytes(
    config: fused.QuantiserConfig,
    variant: str,
    layout: str,
    head_dim: int,
    dtype: torch.dtype,
    monkeypatch: pytest.MonkeyPatch,
):
    """Into poisoned buffers, byte for byte what the default configuration writes (and so the reference's
    rule holds): the knobs change how tiles are distributed and divided, never a value. Q's 20 tiles
    (5 a head: the last one ragged) over 7 programs of 3 leave the last program one tile short; the
    persistent grid of 3 programs walks 7, 7 and 6 of them, then 2, 1 and 1 of K's 4 and of V's 4."""
    monkeypatch.setattr(fused, "sm_count", lambda device: CPU_SM_COUNT)
    problem = _problem(head_dim, dtype, (600, 150))
    q, k, v = _inputs(problem)
    quantisation = fp8.quantisation_named(variant)
    default = fused.quantise_fused(q, k, v, quantisation, LAYOUTS[layout]).buffers()
    quantiser = fused.FusedQuantiser(q.shape, k.shape, dtype, "cpu", quantisation, LAYOUTS[layout], config=config)
    quantiser.operands.poison_()
    operands = quantiser(q, k, v)
    for name, got, want in zip(("q8", "k8", "vt8", "q_scale", "k_scale", "v_scale"), operands.buffers(), default,
                               strict=True):  # fmt: skip
        assert torch.equal(got, want), f"{config.describe()}: {name} differs from the default configuration's"
    assert quantiser.launches == (1 if config.single_launch else 3) * (1 if quantisation.block else 2) + (
        0 if quantisation.block else 1
    )


@pytest.mark.parametrize("config", [None, *KNOB_CONFIGS[:3], KNOB_CONFIGS[-1]],
                         ids=lambda config: config.describe() if config else "default")  # fmt: skip
def test_a_quantiser_of_k_and_v_only_writes_their_bytes_and_leaves_q(config: fused.QuantiserConfig | None):
    """``query=False`` (cute/fp8 quantising Q in its kernel): into poisoned buffers, K's and V's bytes and
    scales exactly as the full quantiser writes them; Q's bytes and scales untouched (still poisoned)."""
    problem = _problem(64, torch.bfloat16, (600, 150))
    q, k, v = _inputs(problem)
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["cute"]
    full = fused.quantise_fused(q, k, v, quantisation, layout, config=config).buffers()
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", quantisation, layout, config=config, query=False)
    quantiser.operands.poison_()
    q8, k8, vt8, q_scale, k_scale, v_scale = quantiser(q, k, v).buffers()
    for name, got, want in (("k8", k8, full[1]), ("vt8", vt8, full[2]), ("k_scale", k_scale, full[4]),
                            ("v_scale", v_scale, full[5])):  # fmt: skip
        assert torch.equal(got, want), f"{name} differs from the full quantiser's"
    assert torch.all(q8 == 0x7F) and torch.all(q_scale.isnan())
    launched = quantiser.config
    assert quantiser.launches == (1 if launched.single_launch else 2) + (launched.value_config is not None)


def test_a_quantiser_of_k_and_v_only_refuses_per_tensor_scales_and_persistent_grids():
    shapes = ((2, 2, 64, 64), (2, 1, 64, 64), torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="needs block scales and no persistent grid, got block "):
        fused.FusedQuantiser(*shapes, fp8.quantisation_named("block"), LAYOUTS["cute"], query=False,
                             config=fused.QuantiserConfig(programs_per_sm=1))  # fmt: skip
    with pytest.raises(ValueError, match="needs block scales and no persistent grid, got per-tensor"):
        fused.FusedQuantiser(*shapes, fp8.quantisation_named("per-tensor"), LAYOUTS["cute"], query=False)


@triton.jit
def _interleaved_order_kernel(ORDER, q_programs, k_programs, v_programs):
    """ORDER[program] = (tensor, index) of each program of an interleaved launch."""
    program = tl.program_id(0)
    tensor, index = kernel._interleaved_program(program, q_programs, k_programs, v_programs)
    tl.store(ORDER + 2 * program, tensor)
    tl.store(ORDER + 2 * program + 1, index)


def _interleaved_order(programs: tuple[int, int, int]) -> list[tuple[int, int]]:
    order = torch.full((sum(programs), 2), -1, dtype=torch.int32)
    _interleaved_order_kernel[(sum(programs),)](order, *programs)
    return [tuple(pair) for pair in order.tolist()]


@pytest.mark.parametrize(
    ("programs", "turns"),
    [((3, 5, 4), [0, 1, 2] * 3 + [1, 1, 2]), ((0, 3, 5), [1, 2] * 3 + [2, 2]), ((0, 4, 2), [1, 2] * 2 + [1, 1])],
)
def test_interleaved_programs_take_turns_among_the_tensors_that_have_programs(programs, turns):
    """Each tensor's programs once each, in order, and the tensors with programs taking turns while all have some
    left: Q, K, V, Q, K, V, ..., or K, V, K, V, ... where Q has none (a quantiser of K and V only)."""
    order = _interleaved_order(programs)
    assert [tensor for tensor, _ in order] == turns
    for tensor, count in enumerate(programs):
        assert [index for t, index in order if t == tensor] == list(range(count))


def test_an_interleaved_order_that_gives_q_a_turn_without_programs_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The order test fails the planted bug: the turns counted over three tensors whatever Q has (the order before
    the K/V-only launch), which runs K's programs, then V's, never alternating."""

    @triton.jit
    def three_turns(program, q_programs, k_programs, v_programs):
        shared = tl.where(q_programs < k_programs, q_programs, k_programs)
        shared = tl.where(v_programs < shared, v_programs, shared)
        rest = program - 3 * shared
        k_rest = k_programs - shared
        tensor = tl.where(
            rest < 0,
            program % 3,
            tl.where(rest < q_programs - shared, 0, tl.where(rest < q_programs - shared + k_rest, 1, 2)),
        )
        before = tl.where(tensor == 0, 0, tl.where(tensor == 1, q_programs - shared, q_programs - shared + k_rest))
        return tensor, tl.where(rest < 0, program // 3, shared + rest - before)

    monkeypatch.setattr(kernel, "_interleaved_program", three_turns)
    assert [tensor for tensor, _ in _interleaved_order((0, 3, 5))] == [1, 1, 1, 2, 2, 2, 2, 2]


def test_a_launch_that_leaves_tiles_unwritten_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The knob test's check fails a planted bug: V's tile count one short (the loops stop before its
    last tile), so that the last V tile keeps its poison."""
    problem = _problem(64, torch.float16, (600, 150))
    q, k, v = _inputs(problem)
    quantisation, layout = fp8.quantisation_named("block"), LAYOUTS["cute"]
    default = fused.quantise_fused(q, k, v, quantisation, layout).buffers()
    geometries = fused._geometries

    def one_v_tile_short(*args):
        q_geometry, k_geometry, v_geometry = geometries(*args)
        return q_geometry, k_geometry, dataclasses.replace(v_geometry, tiles=v_geometry.tiles - 1)

    monkeypatch.setattr(fused, "_geometries", one_v_tile_short)
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", quantisation, layout)
    quantiser.operands.poison_()
    got = quantiser(q, k, v).buffers()
    assert [torch.equal(a, b) for a, b in zip(got, default, strict=True)] == [True, True, False, True, True, False]


# Rows e_0 + e_j: their rotation is the matrix's rows 0 and j added, which cancel exactly wherever the
# two Hadamard rows differ in sign (half the columns; the butterflies' sums there are 1 - 1).
CANCELLING_ROWS = (1, 5, -1)


def _bytes_at_rotated_zeros(device: str, method: str, division: str) -> tuple[torch.Tensor, int]:
    """Q's and K's first rows set to e_0 + e_j, quantised with block scales and rotation: the e4m3 bytes
    written where the exact (fp64) rotation is zero, and how many of those lie in columns of negative sign."""
    problem = _problem(64, torch.bfloat16)
    q, k, v = (tensor.clone() for tensor in _inputs(problem, device))
    count = len(CANCELLING_ROWS)
    rows = torch.zeros(count, problem.head_dim, dtype=q.dtype)
    rows[:, 0] = 1
    rows[torch.arange(count), list(CANCELLING_ROWS)] = 1
    q[:, :, :count] = rows.to(device)
    k[:, :, :count] = rows.to(device)
    quantisation = fp8.quantisation_named("block+rotation")
    config = fused.QuantiserConfig(division=division)
    operands = fused.quantise_fused(q, k, v, quantisation, LAYOUTS["cute"], method, config)
    matrix = fp8.random_hadamard(problem.head_dim, quantisation.seed).double()
    zero = rows.double() @ matrix == 0
    written = [x8[:, :, :count].cpu().view(torch.uint8)[:, :, zero] for x8 in (operands.q8, operands.k8)]
    return torch.cat([bytes_.reshape(-1) for bytes_ in written]), int((zero & (matrix[0] < 0)).sum())


@pytest.mark.parametrize("division", fused.DIVISIONS)
@pytest.mark.parametrize("method", fused.ROTATION_METHODS)
def test_a_rotated_zero_is_plus_zero_under_both_divisions(method: str, division: str):
    """A rotated value whose sums cancel exactly is written as +0 (0x00) by every rotation method and both
    divisions, so the ``division`` knob cannot change its byte: the butterflies' (and the Kronecker rotation's) column
    sign comes after the sums (the rotated zero would be -0 in a negative column) and the reciprocal division under
    Triton 3.6 turns x = -0 into +0 where ``div.rn`` keeps -0 (issue #37: the GPU knob test's 0x80/0x00)."""
    written, in_negative_columns = _bytes_at_rotated_zeros("cpu", method, division)
    assert in_negative_columns > 0, "the rows must cancel in columns of negative sign"
    assert written.numel() > 0 and (written == 0x00).all(), sorted(set(written.tolist()))


@triton.jit
def _rotated_with_signed_zeros(x, rotation, rotation_scale, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                               LOG2_HEAD_DIM: tl.constexpr, ROTATE: tl.constexpr, FP32_DOT: tl.constexpr,
                               REGISTER_OPERAND: tl.constexpr):  # fmt: skip
    """The butterfly rotation without ``_rotated``'s + 0: a cancelled sum in a negative column is -0."""
    return kernel._hadamard_butterflies(x.to(tl.float32), ROWS, HEAD_DIM, LOG2_HEAD_DIM) * rotation[None, :]


def test_a_rotated_minus_zero_fails_the_zero_rule(monkeypatch: pytest.MonkeyPatch):
    """The rule above fails the planted bug: the butterflies' zero left with its column's sign (what the
    kernel did before issue #37), which the ieee division writes as 0x80."""
    monkeypatch.setattr(kernel, "_rotated", _rotated_with_signed_zeros)
    written, _ = _bytes_at_rotated_zeros("cpu", "butterfly", "ieee")
    assert (written == 0x80).any(), sorted(set(written.tolist()))


@triton.jit
def _kronecker_with_signed_zeros(blocks, rotation, FP32_DOT: tl.constexpr, REGISTER_OPERAND: tl.constexpr):
    """The Kronecker rotation without its + 0: a cancelled sum in a negative column is -0."""
    hadamard_16, signs = rotation
    products = ()
    for block in tl.static_range(len(blocks)):
        products = products + (tl.dot(blocks[block].to(tl.float32), hadamard_16, input_precision="ieee"),)  # noqa: RUF005
    products = kernel._butterflies_across(products)
    rotated = ()
    for block in tl.static_range(len(blocks)):
        rotated = rotated + (products[block] * signs[block][None, :],)  # noqa: RUF005
    return rotated


def test_a_kronecker_minus_zero_fails_the_zero_rule(monkeypatch: pytest.MonkeyPatch):
    """The rule above fails the same planted bug in the Kronecker rotation (its column sign after the sums without
    the + 0), which the ieee division writes as 0x80."""
    monkeypatch.setattr(kernel, "_kronecker_rotated", _kronecker_with_signed_zeros)
    written, _ = _bytes_at_rotated_zeros("cpu", "kronecker", "ieee")
    assert (written == 0x80).any(), sorted(set(written.tolist()))


def test_kernel_operands_give_the_emulation_the_reference_values():
    """``as_quantised`` undoes V's layout: the emulation reads the same V bytes as ``quantise`` gives."""
    problem = _problem(64, torch.float16)
    q, k, v = _inputs(problem)
    quantisation = fp8.quantisation_named("block")
    for layout in LAYOUTS.values():
        back = fused.quantise_fused(q, k, v, quantisation, layout).as_quantised()
        reference = fp8.quantise(q, k, v, quantisation)
        for name in ("q8", "k8", "v8"):
            assert torch.equal(getattr(back, name).view(torch.uint8), getattr(reference, name).view(torch.uint8))


def test_quantise_for_kernel_uses_the_reference_on_a_cpu_outside_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    problem = _problem(64, torch.float16)
    q, k, v = _inputs(problem)
    quantisation = fp8.quantisation_named("block+rotation")
    monkeypatch.setattr(fused, "triton_interpreting", lambda: False)
    operands = fused.quantise_for_kernel(q, k, v, quantisation, LAYOUTS["gluon"])
    reference = fp8.kernel_operands(fp8.quantise(q, k, v, quantisation), LAYOUTS["gluon"])
    for name in ("q8", "k8", "vt8"):
        assert torch.equal(getattr(operands, name).view(torch.uint8), getattr(reference, name).view(torch.uint8))
    with pytest.raises(ValueError, match="needs a CUDA device, or CPU under TRITON_INTERPRET=1; got cpu"):
        fused.quantise_fused(q, k, v, quantisation, LAYOUTS["gluon"])


# ----------------------------------------------------------------------------------------------------
# Planted bugs: the comparison fails each
# ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rotated_case():
    problem = _problem(128, torch.bfloat16, (130, 300))
    q, k, v = _inputs(problem)
    quantisation = fp8.quantisation_named("block+rotation")
    layout = LAYOUTS["cute"]
    operands = fused.quantise_fused(q, k, v, quantisation, layout)
    reference = fp8.kernel_operands(fp8.quantise(q, k, v, quantisation), layout)
    assert fused.operand_differences(operands, reference).ok
    return (q, k, v), quantisation, layout, operands, reference


def _fails(operands: fp8.KernelOperands, reference: fp8.KernelOperands, tensor: str) -> None:
    differences = fused.operand_differences(operands, reference)
    failed = [difference.name for difference in differences.tensors if not difference.ok]
    assert failed == [tensor], differences.summary()


def test_a_wrong_block_scale_fails(rotated_case):
    """K's block 0 given the scale of block 1 (its bytes unchanged): a scale off by far more than ulps."""
    _, _, _, operands, reference = rotated_case
    k_scale = operands.k_scale.clone()
    k_scale[:, :, 0] = k_scale[:, :, 1]
    _fails(dataclasses.replace(operands, k_scale=k_scale), reference, "k")


def test_a_block_cast_with_its_neighbours_scale_fails(rotated_case):
    """V's block 0 rounded with twice its scale (its scale entry right): its bytes a binade off (and
    V has no rotation, so even one differing byte fails)."""
    (_, _, v), quantisation, layout, operands, reference = rotated_case
    scales = operands.v_scale.clone()
    scales[:, :, 0] *= 2
    wrong = fp8.quantise_with(v.float(), scales, quantisation.kv_block_rows)
    _fails(dataclasses.replace(operands, vt8=fp8.transposed_values(wrong, layout)), reference, "v")


def test_rotation_skipped_for_k_fails(rotated_case):
    (q, k, v), quantisation, layout, operands, reference = rotated_case
    unrotated = fused.quantise_fused(q, k, v, dataclasses.replace(quantisation, rotation=False), layout)
    _fails(dataclasses.replace(operands, k8=unrotated.k8, k_scale=unrotated.k_scale), reference, "k")


def test_v_not_permuted_fails(rotated_case):
    """Vᵀ in key order where the kernel reads it permuted (the layout it claims)."""
    (q, k, v), quantisation, _, operands, reference = rotated_case
    key_order = fused.quantise_fused(q, k, v, quantisation, fp8.ValueLayout(permuted=False))
    _fails(dataclasses.replace(operands, vt8=key_order.vt8), reference, "v")


def test_padding_that_is_not_zero_fails(rotated_case):
    _, _, _, operands, reference = rotated_case
    vt8 = operands.vt8.clone()
    vt8.view(torch.uint8)[..., -1] = 0x38  # 1.0 in e4m3, in the slot past the last key (Sk = 300 -> 304)
    _fails(dataclasses.replace(operands, vt8=vt8), reference, "v")


def test_two_steps_or_too_many_one_step_differences_fail_a_rotated_tensor(rotated_case):
    _, _, _, operands, reference = rotated_case
    bytes_two_steps = operands.q8.view(torch.uint8).clone()
    bytes_two_steps.view(-1)[123] = reference.q8.view(torch.uint8).view(-1)[123] ^ 0x02
    _fails(dataclasses.replace(operands, q8=bytes_two_steps.view(torch.float8_e4m3fn)), reference, "q")
    # One step (the ordinal plus one) on a tenth of Q: each difference is allowed, their number is not.
    shifted = reference.q8.view(torch.uint8).clone().view(-1)
    picked = shifted[::10]
    shifted[::10] = torch.where(picked & 0x7F < 0x7E, picked + 1, picked - 1)
    _fails(dataclasses.replace(operands, q8=shifted.view(operands.q8.shape).view(torch.float8_e4m3fn)), reference, "q")


def test_e4m3_steps_count_the_grid_across_zero():
    codes = torch.tensor([0x00, 0x80, 0x01, 0x81, 0x38, 0x39, 0x7E], dtype=torch.uint8)
    other = torch.tensor([0x80, 0x00, 0x00, 0x01, 0x39, 0x37, 0x7D], dtype=torch.uint8)
    steps = fused.e4m3_steps(codes.view(torch.float8_e4m3fn), other.view(torch.float8_e4m3fn))
    assert steps.tolist() == [0, 0, 1, 2, 1, 2, 1]


# ----------------------------------------------------------------------------------------------------
# The interpreter's rounding onto e4m3's grid, and bad input
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, kernel._round_to_e4m3_grid(tl.load(X + offs)))


def test_software_rounding_is_torchs_e4m3_cast():
    """Every e4m3 value, every midpoint between neighbours and the fp32 values next to each, with
    both signs and the subnormals: rounded exactly as torch's cast rounds (ties to even, -0 kept)."""
    grid = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    midpoints = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([midpoints, torch.nextafter(midpoints, torch.zeros(1)), torch.nextafter(midpoints, grid[-1:])])
    values = torch.cat([grid, near, torch.tensor([0.0, 2.0**-12, 2.0**-10, 3 * 2.0**-11, fp8.E4M3_MAX])])
    values = torch.cat([values, -values])
    size = triton.next_power_of_2(values.numel())
    x = torch.zeros(size)
    x[: values.numel()] = values
    y = torch.empty(size)
    _round_kernel[(1,)](x, y, N=size)
    expected = x.to(torch.float8_e4m3fn).float()
    assert torch.equal(y.view(torch.int32), expected.view(torch.int32)), (x[y != expected], y[y != expected])


@triton.jit
def _division_kernel(X, SCALE, Y, BLOCK: tl.constexpr, CORRECTIONS: tl.constexpr, INTERPRETED: tl.constexpr):
    """The kernel's reciprocal division of each x by its own scale (the tile code with one row per element)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, scale = tl.load(X + offs), tl.load(SCALE + offs)
    divisor, reciprocal, factor = kernel._divisor_of(scale)
    prescaled = tl.max(factor, axis=0) != 1.0
    quotient = kernel._quotient(x, scale, divisor, reciprocal, factor, prescaled, True, CORRECTIONS, INTERPRETED)
    tl.store(Y + offs, quotient)


def _reciprocal_division(x: torch.Tensor, scale: torch.Tensor, corrections: int) -> torch.Tensor:
    """x / scale by ``_quotient``'s reciprocal division, in blocks of DIVISION_BLOCK (a multiple of it)."""
    assert x.numel() % DIVISION_BLOCK == 0
    y = torch.empty_like(x)
    _division_kernel[(x.numel() // DIVISION_BLOCK,)](
        x, scale, y, BLOCK=DIVISION_BLOCK, CORRECTIONS=corrections, INTERPRETED=not x.is_cuda
    )
    return y


def _every_value_pair(dtype: torch.dtype, binades: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """x: every mantissa of ``dtype`` in [1, 2) with both signs, and ±0, times 2^-k for each k in
    ``binades``; the scale of every amax mantissa of ``dtype`` (amax / 448 as ``block_scales`` divides),
    all pairs. The division is exact in the scale of both (fp32's normal range), so this is every case."""
    codes = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype).float()
    mantissas = codes[(codes >= 1) & (codes < 2)]
    signed = torch.cat([mantissas, -mantissas, torch.tensor([0.0, -0.0])])
    values = torch.cat([signed * 2.0**-k for k in binades])
    scales = mantissas / torch.full_like(mantissas, fp8.E4M3_MAX)
    x, scale = torch.cartesian_prod(values, scales).unbind(-1)
    pad = -x.numel() % DIVISION_BLOCK
    return torch.cat([x, torch.ones(pad)]), torch.cat([scale, torch.ones(pad)])


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal fp32 bit patterns, or both NaN."""
    return (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_one_correction_divides_every_bf16_and_fp16_value_exactly(dtype: torch.dtype):
    """Unrotated tensors (V; Q and K without rotation) take one Newton correction: for every pair of a
    value and a scale of that dtype the quotient is the IEEE quotient, bit for bit (±0 included)."""
    x, scale = _every_value_pair(dtype, (0, 9) if dtype == torch.float16 else (0, 5, 9, 12))
    got = _reciprocal_division(x, scale, fused.UNROTATED_CORRECTIONS)
    wrong = ~_same_bits(got, x / scale)
    assert not wrong.any(), (x[wrong][:5], scale[wrong][:5], got[wrong][:5])


def test_two_corrections_divide_any_fp32_value_exactly_and_none_do_not():
    """Rotated values are any fp32 number: Markstein's second correction makes the quotient correctly
    rounded (here on a million random pairs); without corrections x · (1 / s) misses on many."""
    generator = torch.Generator().manual_seed(0)
    size = 1 << 20
    x = (torch.rand(size, generator=generator) + 1) * torch.where(torch.rand(size, generator=generator) < 0.5, -1, 1)
    scale = (torch.rand(size, generator=generator) + 1) * 2.0**-9
    got = _reciprocal_division(x, scale, fused.ROTATED_CORRECTIONS)
    assert _same_bits(got, x / scale).all()
    uncorrected = _reciprocal_division(x, scale, 0)
    assert (~_same_bits(uncorrected, x / scale)).sum() > size // 10


def _edge_scale_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of tiny values (scales down to fp32's subnormals) with values across their range and ±0,
    and an infinite scale (a block holding an infinity) with finite, ±0, infinite and subnormal x."""
    tiny_scales = torch.tensor([2.0**-61, 2.0**-100, 2.0**-126, 2.0**-133, 2.0**-149, 3 * 2.0**-140, 1.7e-30])
    fractions = torch.tensor([1.0, -448.0, 300.5, -(2.0**-9), 0.0, -0.0, 1e-3])
    x = torch.cat([fractions * scale for scale in tiny_scales])
    scale = tiny_scales.repeat_interleave(fractions.numel())
    special = torch.tensor([3.0, -3.0, 0.0, -0.0, float("inf"), -float("inf"), 1e-40, -1e-40])
    x = torch.cat([x, special])
    scale = torch.cat([scale, torch.full((special.numel(),), float("inf"))])
    pad = -x.numel() % DIVISION_BLOCK
    return torch.cat([x, torch.ones(pad)]), torch.cat([scale, torch.ones(pad)])


def _without_zeros(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs with x = ±0 replaced by 1 / 1. The rotated path keeps the fmas' zero for x = -0
    (``_quotient``): +0 from the hardware fma and from Triton 3.6's interpreter, -0 from 3.8's."""
    zero = x == 0
    return torch.where(zero, 1.0, x), torch.where(zero, 1.0, scale)


@pytest.mark.filterwarnings("ignore:(invalid value|divide by zero) encountered:RuntimeWarning")
@pytest.mark.parametrize("corrections", [fused.UNROTATED_CORRECTIONS, fused.ROTATED_CORRECTIONS])
def test_reciprocal_division_is_exact_for_tiny_and_infinite_scales(corrections: int):
    """Blocks of tiny values (moved up by a power of two) and blocks holding an infinity (scale inf:
    x / inf is a signed zero, inf / inf NaN) divide as IEEE division does."""
    x, scale = _edge_scale_pairs()
    if corrections == fused.ROTATED_CORRECTIONS:
        x, scale = _without_zeros(x, scale)
    got = _reciprocal_division(x, scale, corrections)
    wrong = ~_same_bits(got, x / scale)
    assert not wrong.any(), (x[wrong], scale[wrong], got[wrong], (x / scale)[wrong])


def test_a_quantiser_beyond_shared_memory_is_refused_by_the_rungs_capability_check():
    """D=256 with rotation: the sign matrix and the tiles in flight exceed an sm_90 CTA's shared memory, so
    the FP8 rungs' check refuses it with the bytes (the launch used to fail with OutOfResources); D=128 fits."""
    quantisation = fp8.quantisation_named("block+rotation")
    needed = fused.shared_bytes(256, torch.bfloat16, quantisation)
    assert needed > SM90_SHARED_MEMORY_BYTES >= fused.shared_bytes(128, torch.bfloat16, quantisation)
    decode_step = Problem(1, 32, 1, 4096, 256, dtype=torch.bfloat16, kv_heads=8)
    ok, reason = fused.shared_memory_supported("triton/fp8", decode_step, quantisation)
    assert not ok and f"{needed:,}" in reason and "232,448" in reason, reason
    assert fused.shared_memory_supported("triton/fp8", decode_step.with_(head_dim=128), quantisation) == (True, "")


def test_bad_inputs_are_refused_with_what_was_expected():
    quantisation = fp8.quantisation_named("block")
    layout = LAYOUTS["triton"]
    with pytest.raises(TypeError, match=r"reads fp16 or bf16, got torch\.float32"):
        fused.FusedQuantiser((1, 1, 64, 64), (1, 1, 64, 64), torch.float32, "cpu", quantisation, layout)
    with pytest.raises(ValueError, match="power-of-two head_dim, got 96"):
        fused.FusedQuantiser((1, 1, 64, 96), (1, 1, 64, 96), torch.float16, "cpu", quantisation, layout)
    with pytest.raises(ValueError, match=r"butterfly rotation runs up to head_dim 128 .*got 256"):
        fused.FusedQuantiser(
            (1, 1, 64, 256), (1, 1, 64, 256), torch.float16, "cpu", fp8.quantisation_named("rotation"), layout,
            "butterfly",
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"kronecker rotation runs up to head_dim 128 .*got 256"):
        fused.FusedQuantiser(
            (1, 1, 64, 256), (1, 1, 64, 256), torch.float16, "cpu", fp8.quantisation_named("rotation"), layout,
            "kronecker",
        )  # fmt: skip
    with pytest.raises(ValueError, match="rotation_method must be one of"):
        fused.FusedQuantiser((1, 1, 64, 64), (1, 1, 64, 64), torch.float16, "cpu", quantisation, layout, "fft")
    for knobs, message in (
        ({"tiles_per_program": 0}, "tiles_per_program and num_stages must be >= 1, got 0 and 1"),
        ({"prefetch": True, "num_stages": 2}, "choose one"),
        ({"prefetch": True, "tma": True}, "prefetch .registers. and tma .shared memory. both overlap loads"),
        ({"num_warps": 3}, "got 3"),
        ({"maxnreg": 300}, r"\[24, 255\] or be None, got 300"),
        ({"division": "fast"}, "got 'fast'"),
        ({"programs_per_sm": -1}, "programs_per_sm must be >= 0"),
        (
            {"programs_per_sm": 2, "tiles_per_program": 4},
            "needs single_launch=True and tiles_per_program=1, got True and 4",
        ),
        ({"programs_per_sm": 2, "single_launch": False}, "needs single_launch=True and tiles_per_program=1, got False"),
        ({"interleave": True, "single_launch": False}, "single_launch=True and programs_per_sm=0, got False and 0"),
        ({"interleave": True, "programs_per_sm": 1}, "single_launch=True and programs_per_sm=0, got True and 1"),
    ):
        with pytest.raises(ValueError, match=message):
            fused.QuantiserConfig(**knobs)  # fmt: skip
    quantiser = fused.FusedQuantiser((1, 2, 64, 64), (1, 1, 64, 64), torch.float16, "cpu", quantisation, layout)
    q = torch.zeros(1, 2, 64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"k: expected \(1, 1, 64, 64\) torch.float16 on cpu"):
        quantiser(q, q, q)
    # TMA reads 16-byte aligned rows: a row stride of 68 fp16 values (136 bytes) is refused, not misread.
    config = fused.QuantiserConfig(num_stages=3, tma=True)
    quantiser = fused.FusedQuantiser((1, 2, 64, 64), (1, 2, 64, 64), torch.float16, "cpu", quantisation, layout,
                                     config=config)  # fmt: skip
    unaligned = torch.zeros(1, 2, 64, 68, dtype=torch.float16)[..., :64]
    with pytest.raises(ValueError, match=r"tma configuration needs .* got strides \(8704, 4352, 68, 1\)"):
        quantiser(unaligned, unaligned, unaligned)


def test_ab_times_each_configuration_end_to_end_in_rounds(monkeypatch: pytest.MonkeyPatch):
    """bench/fp8_quantiser.py --ab --e2e-each (no GPU: timings and quantisers stubbed): each configuration is the
    rungs' default while its end-to-end run is built, the quantiser alone runs at that configuration, every round
    times each configuration in turn, rows keep medians and e2e - kernel - quantiser, the default comes back."""
    import argparse

    from bench import fp8_quantiser as bench

    timings = iter([1.0, 3.0, 2.0, 5.0, 0.4, 1.0, 3.5, 2.5, 5.5, 0.6])  # kernel, (e2e, alone) x 2, per round
    monkeypatch.setattr(bench, "_time", lambda run, args: (run(), next(timings))[1])
    timed, built, out = [], [], torch.zeros(2)

    class Alone:
        def __init__(self, *args, config: fused.QuantiserConfig, query: bool):
            self.config = config

        def __call__(self, *inputs):
            timed.append(f"alone {self.config.describe()}")

    def end_to_end(*args):
        built.append(fused.DEFAULT_CONFIG)
        return lambda: (timed.append("e2e"), out)[1]

    monkeypatch.setattr(bench.fp8_quantiser, "FusedQuantiser", Alone)
    rung = argparse.Namespace(DEFAULT_QUANTISATION=fp8.VARIANTS["block+rotation"], prepare_end_to_end=end_to_end,
                              prepare=lambda *args: lambda: (timed.append("kernel"), out)[1])  # fmt: skip
    configs = [fused.PREFETCH_CONFIG, dataclasses.replace(fused.PREFETCH_CONFIG, interleave=True)]
    # use_config replaces both; monkeypatch puts them back whatever happens.
    monkeypatch.setattr(fused, "DEFAULT_CONFIG", fused.DEFAULT_CONFIG)
    monkeypatch.setattr(fused, "KIND_CONFIGS", fused.KIND_CONFIGS)
    problem = Problem.canonical(128, heads=1, causal=True)
    default = fused.DEFAULT_CONFIG, fused.KIND_CONFIGS
    rows = bench._rung_end_to_end("cute/fp8", rung, problem, (torch.zeros(1, 1, 128, 128),) * 3, configs,
                                  argparse.Namespace(e2e_rounds=2))  # fmt: skip
    assert built == configs
    assert default == (fused.DEFAULT_CONFIG, fused.KIND_CONFIGS), "the next rung's check reads the default"
    alone = [f"alone {config.describe()}" for config in configs]
    assert timed == ["kernel", "e2e", "e2e"] + ["kernel", "e2e", alone[0], "e2e", alone[1]] * 2
    assert [(row.config, row.kernel_us, row.e2e_us, row.quantiser_us) for row in rows] == [
        (configs[0].describe(), 1000.0, 3250.0, 2250.0), (configs[1].describe(), 1000.0, 5250.0, 500.0)
    ]  # fmt: skip
    assert rows[0].other_us == 0.0 and rows[1].other_us == 3750.0 and not rows[0].note


def test_kv_only_ab_times_the_kv_default_and_the_fastest_candidate_end_to_end(monkeypatch: pytest.MonkeyPatch):
    """``--ab --kv-only`` times cute/fp8 end to end with the K/V-only launch's default and the fastest candidate (once
    where they are the same); ``--e2e-each`` every passing candidate; plain ``--ab`` makes the fastest the rungs'."""
    import argparse

    import bench.fp8_quantiser as bench

    monkeypatch.setattr(fused, "DEFAULT_CONFIG", fused.DEFAULT_CONFIG)
    monkeypatch.setattr(fused, "KIND_CONFIGS", fused.KIND_CONFIGS)
    problem = Problem.canonical(128)
    default = fused.default_config(128, fp8.VARIANTS["block+rotation"], query=False)
    fastest = dataclasses.replace(default, tiles_per_program=16)
    passing = [default, fastest]

    def configs(kv_only: bool, e2e_each: bool, best: fused.QuantiserConfig | None):
        return bench.end_to_end_configs(argparse.Namespace(kv_only=kv_only, e2e_each=e2e_each), problem, passing, best)

    assert configs(True, False, fastest) == [default, fastest]
    assert configs(True, False, default) == [default]
    assert configs(True, True, fastest) == passing
    assert (
        configs(False, False, fastest) is None and fused.default_config(128, fp8.VARIANTS["block+rotation"]) == fastest
    )


def test_a_configuration_with_a_bar_launches_v_apart_under_the_second():
    """``--candidates``/``--quantiser-config`` text: ``A|B`` is A with ``value_config=B``; without a bar, none."""
    from bench.fp8_quantiser import quantiser_config

    apart = quantiser_config(
        "tiles_per_program=8,num_stages=2|tiles_per_program=8,prefetch=true,num_warps=8,maxnreg=72"
    )
    want = fused.QuantiserConfig(tiles_per_program=8, prefetch=True, num_warps=8, maxnreg=72)
    assert apart == fused.QuantiserConfig(tiles_per_program=8, num_stages=2, value_config=want)
    assert quantiser_config("tiles_per_program=8,num_stages=2").value_config is None


def test_candidates_take_a_named_list_or_configurations():
    """``--candidates kv-d128`` is ``KV_D128_CANDIDATES`` (a copy); any other text, ';'-separated configurations."""
    from bench.fp8_quantiser import KV_D128_CANDIDATES, candidate_configs

    named = candidate_configs("kv-d128")
    assert named == KV_D128_CANDIDATES and named is not KV_D128_CANDIDATES
    assert candidate_configs("tiles_per_program=8;tiles_per_program=4") == [
        fused.QuantiserConfig(tiles_per_program=8),
        fused.QuantiserConfig(tiles_per_program=4),
    ]


# ----------------------------------------------------------------------------------------------------
# sm_90a builds (no GPU needed)
# ----------------------------------------------------------------------------------------------------
_BUILD_PROBE = r"""
import json, re, sys
import torch
from bench.fp8_quantiser import FULL_GRID, sweep_configs
from common.contract import fp8
from triton_impl import fp8_quantiser as fused
from common.contract.capability import SM90_SHARED_MEMORY_BYTES
from common.reporting.static import cubin_resources

def facts(name, binary, step, rotated, method, config):
    usage = cubin_resources(binary.cubin).values()
    ptx = binary.ptx
    return {
        "name": name, "step": step, "rotated": rotated, "method": method, "division": config.division,
        # ptxas puts spilled registers in the stack frame (local memory arrays would be "local").
        "spills": max(u["local_bytes"] + u["stack_bytes"] for u in usage),
        "cast": bool(re.search(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
        "ieee_divisions": len(re.findall(r"div\.rn\.f32", ptx)),
        "approximate_division": bool(re.search(r"div\.(full|approx)\.f32", ptx)),
        "fma": bool(re.search(r"fma\.rn\.f32", ptx)),
        "wgmma": bool(re.search(r"wgmma\.mma_async", ptx)),
        "vector_loads": bool(re.search(r"ld\.global\.v4\.b32", ptx))
        or bool(re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10", ptx))
        or bool(re.search(r"cp\.async\.bulk\.tensor\.4d", ptx)),
        "scalar_loads": bool(re.search(r"ld\.global\.(b16|b8)\b", ptx)),
        "vector_stores": bool(re.search(r"st\.global\.v4\.b32", ptx)),
        "byte_stores": bool(re.search(r"st\.global\.b8\b", ptx)),
    }

def builds(head_dim, variant, method, layout, config):
    quantisation = fp8.VARIANTS[variant]
    steps = ["block"] if quantisation.block else ["amax", "cast"]
    binaries = fused.compile_sm90(head_dim, torch.bfloat16, quantisation, layout, method, config)
    # With value_config (block scales only) V's tiles build a binary of their own after Q's and K's.
    roles = steps * (2 if config.value_config else 1) + ([] if quantisation.block else ["reduce"])
    assert len(binaries) == len(roles), (len(binaries), roles)
    # V is never rotated: its own binary has no rotation (no wgmma) to find.
    rotated = [quantisation.rotation] * len(roles)
    if config.value_config:
        rotated[1] = False
    name = f"D={head_dim} {variant} {method} {layout} {config.describe()}"
    return [facts(f"{name} {step}{' (V)' if index and config.value_config else ''}", binary, step, rotated[index],
                  method, config) for index, (step, binary) in enumerate(zip(roles, binaries))]

# A head dim: every launch's default build at it; "sweep": the bench's sweep and the planted register cap.
only_defaults = sys.argv[1] != "sweep"
rows, sweep, planted = [], [], []
for head_dim in (int(sys.argv[1]),) if only_defaults else ():
    for variant, quantisation in fp8.VARIANTS.items():
        methods = fused.ROTATION_METHODS if quantisation.rotation else fused.ROTATION_METHODS[:1]
        for method in methods:
            if head_dim > fused.MAX_HEAD_DIM_OF_METHOD.get(method, head_dim):
                continue
            # The launch of K and V only (query=False) has a KIND_CONFIGS key of its own: built where it differs.
            defaults = dict.fromkeys(fused.default_config(head_dim, quantisation, method, query=query)
                                     for query in (True, False))
            for layout in (fp8.ValueLayout(False, 16), fp8.ValueLayout(True, 128)):
                for config in defaults:
                    rows += builds(head_dim, variant, method, layout, config)
# What bench/fp8_quantiser.py --sweep times (the knobs that change the binary), and a spilling register cap.
layout = fp8.ValueLayout(True, 128)
for variant, method in () if only_defaults else FULL_GRID:
    seen = set()
    for config in sweep_configs(full=True):
        key = (config.num_stages, config.prefetch, config.num_warps, config.maxnreg, config.division, config.tma)
        if key not in seen:
            seen.add(key)
            sweep += builds(128, variant, method, layout, config)
if not only_defaults:
    planted += builds(128, "block+rotation", "tensor_core", layout, fused.QuantiserConfig(num_stages=2, maxnreg=96))
print(json.dumps({"rows": rows, "sweep": sweep, "planted": planted}))
"""


def _default_builds(head_dim: int) -> int:
    """The binaries of every default build the probe makes at ``head_dim``: per variant, rotation method and V layout
    (2), each distinct default (Q, K and V; K and V only) builds 3 binaries per-tensor (amax, cast, reduce), 1 with
    block scales, 2 with V apart (``value_config``); the butterfly and Kronecker rotations only up to their
    ``MAX_HEAD_DIM_OF_METHOD``."""
    total = 0
    for quantisation in fp8.VARIANTS.values():
        methods = fused.ROTATION_METHODS if quantisation.rotation else fused.ROTATION_METHODS[:1]
        for method in methods:
            if head_dim > fused.MAX_HEAD_DIM_OF_METHOD.get(method, head_dim):
                continue
            configs = {fused.default_config(head_dim, quantisation, method, query=query) for query in (True, False)}
            per_launch = 1 if quantisation.block else 3
            total += 2 * sum(per_launch * (2 if config.value_config else 1) for config in configs)
    return total


def _build_probe(what: str) -> dict[str, list[dict]]:
    """``_BUILD_PROBE`` in a child process without the interpreter: ``what`` a head dim (every launch's default build
    at it) or "sweep" (the bench's sweep and the planted register cap)."""
    return json_from_child(["-c", _BUILD_PROBE, what], timeout=1500)


def _assert_exact_arithmetic(rows: list[dict]) -> None:
    """The hardware's round-to-nearest-even e4m3 cast, never Triton's approximate division; the reciprocal division
    instead of a div.rn per element (div.rn left only for the block scales); the tensor-core rotation on wgmma;
    16-byte global loads and stores."""
    for row in rows:
        assert not row["approximate_division"], row["name"]
        assert not row["scalar_loads"] and not row["byte_stores"], row["name"]
        if row["step"] == "reduce":
            continue
        assert row["vector_loads"], row["name"]
        if row["step"] in ("block", "cast"):
            assert row["cast"] and row["vector_stores"] and row["ieee_divisions"] > 0, row["name"]
            per_element = row["ieee_divisions"] >= fused.ELEMENTS_PER_THREAD
            assert per_element == (row["division"] == "ieee"), (row["name"], row["ieee_divisions"])
            assert row["fma"] or row["division"] == "ieee", row["name"]
        if row["rotated"] and row["method"] in ("tensor_core", "kronecker"):
            assert row["wgmma"], row["name"]


@pytest.mark.static
@pytest.mark.release
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fused_quantiser_builds_for_sm90_without_spills_and_with_exact_arithmetic(head_dim: int):
    """Every launch's build at D = 64, 128, 256 (the default configuration, with the specialisation a
    P1 launch gets): no spills and exact arithmetic (``_assert_exact_arithmetic``). One head dim a test, so that
    two workers share the release legs' longest test (150-220 s in one piece, 2026-12-07)."""
    rows = _build_probe(str(head_dim))["rows"]
    assert len(rows) == _default_builds(head_dim), len(rows)
    _assert_exact_arithmetic(rows)
    for row in rows:
        assert row["spills"] == 0, f"{row['name']}: {row['spills']} bytes spilled"


@pytest.mark.static
def test_the_sweeps_quantiser_builds_keep_exact_arithmetic_and_a_spilling_cap_is_caught():
    """The configurations bench/fp8_quantiser.py --sweep times build with exact arithmetic; a register cap that
    spills is caught (the spill check sees it). Under the README's release only (the knobs, not the defaults)."""
    report = _build_probe("sweep")
    assert report["sweep"] and not report["rows"]
    _assert_exact_arithmetic(report["sweep"])
    assert report["planted"] and all(row["spills"] > 0 for row in report["planted"]), report["planted"]


# ----------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def exact_torch_matmul():
    """The reference's rotation in full fp32 (a TF32 GEMM would round the matrix's entries)."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("variant", "method"), CASES, ids=[f"{v}-{m}" for v, m in CASES])
@pytest.mark.parametrize(
    "shape", [(2, 16, 16, 8192, 8192, 128), (2, 8, 2, 1000, 777, 128), (1, 4, 1, 333, 4097, 64)], ids=str
)
def test_gpu_fused_quantiser_gives_the_reference_bytes_and_scales(
    shape: tuple, variant: str, method: str, layout: str, exact_torch_matmul
):
    """P1 (B=2 H=16 S=8192 D=128 bf16), GQA with ragged lengths, D=64 MQA: the CPU test's rule at
    real sizes against the torch quantiser on the GPU; prints the differing counts."""
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = shape
    problem = Problem(batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, kv_heads=kv_heads)
    differences = _compare(*_inputs(problem, "cuda"), variant, method, LAYOUTS[layout])
    print(f"{shape} {variant} {method} {layout}: {differences.summary()}")
    assert differences.ok, differences.summary()


@pytest.mark.gpu
def test_gpu_fused_quantiser_is_deterministic_and_replays_in_a_cuda_graph():
    """The emulation re-quantises to judge a kernel, so the same inputs must give the same bytes;
    compare.py may time under a CUDA graph, so the launches must capture and replay (into poisoned
    buffers)."""
    problem = Problem(2, 8, 1000, 777, 128, dtype=torch.bfloat16, kv_heads=2)
    q, k, v = _inputs(problem, "cuda")
    for variant in ("block+rotation", "rotation"):
        quantiser = fused.FusedQuantiser(
            q.shape, k.shape, q.dtype, q.device, fp8.quantisation_named(variant), LAYOUTS["gluon"]
        )
        first = [t.clone() for t in quantiser(q, k, v).buffers()]
        again = fused.quantise_fused(q, k, v, fp8.quantisation_named(variant), LAYOUTS["gluon"]).buffers()
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), variant
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            quantiser(q, k, v)
        quantiser.operands.poison_()
        graph.replay()
        torch.cuda.synchronize()
        replayed = quantiser.operands.buffers()
        assert all(torch.equal(a, b) for a, b in zip(first, replayed, strict=True)), variant


# What the compiled kernel changes with each knob, beyond KNOB_CONFIGS: cp.async stages, warps, a register cap.
GPU_KNOB_CONFIGS = [
    *KNOB_CONFIGS,
    fused.QuantiserConfig(tiles_per_program=4, num_stages=2),
    fused.QuantiserConfig(tiles_per_program=8, num_stages=3),
    fused.QuantiserConfig(programs_per_sm=1, num_stages=4, num_warps=16, tma=True),
    fused.QuantiserConfig(programs_per_sm=2, num_stages=2, maxnreg=128, tma=True),
    fused.QuantiserConfig(tiles_per_program=4, prefetch=True, maxnreg=128),
    fused.QuantiserConfig(num_warps=16),
    fused.QuantiserConfig(programs_per_sm=2, prefetch=True, maxnreg=128),
    fused.QuantiserConfig(programs_per_sm=2, num_stages=2),
    fused.QuantiserConfig(programs_per_sm=1, num_stages=4, num_warps=16),
    fused.QuantiserConfig(tiles_per_program=8, prefetch=True, maxnreg=128, interleave=True),
    fused.QuantiserConfig(tiles_per_program=8, num_warps=16, maxnreg=64, interleave=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_KNOB_CONFIGS, ids=lambda config: config.describe())
@pytest.mark.parametrize(("variant", "method"), [("block+rotation", "tensor_core"), ("block", "tensor_core"),
                                                 ("per-tensor", "tensor_core"), ("rotation", "butterfly"),
                                                 ("block+rotation", "kronecker")])  # fmt: skip
@pytest.mark.parametrize("shape", [(2, 16, 16, 8192, 8192, 128), (2, 8, 2, 1000, 777, 128)], ids=str)
def test_gpu_every_knob_writes_the_default_configurations_bytes(
    shape: tuple, variant: str, method: str, config: fused.QuantiserConfig
):
    """Compiled, every knob (cp.async stages, prefetching, warps, register caps included) writes byte
    for byte what the default configuration writes, into poisoned buffers, at P1 and a ragged GQA shape."""
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = shape
    problem = Problem(batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, kv_heads=kv_heads)
    q, k, v = _inputs(problem, "cuda")
    quantisation = fp8.quantisation_named(variant)
    default = [t.clone() for t in fused.quantise_fused(q, k, v, quantisation, LAYOUTS["gluon"], method).buffers()]
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, LAYOUTS["gluon"], method,
                                     config)  # fmt: skip
    quantiser.operands.poison_()
    operands = quantiser(q, k, v)
    for name, got, want in zip(("q8", "k8", "vt8", "q_scale", "k_scale", "v_scale"), operands.buffers(), default,
                               strict=True):  # fmt: skip
        assert torch.equal(got, want), f"{config.describe()}: {name} differs from the default configuration's"


@pytest.mark.gpu
@pytest.mark.parametrize("division", fused.DIVISIONS)
@pytest.mark.parametrize("method", fused.ROTATION_METHODS)
def test_gpu_a_rotated_zero_is_plus_zero_under_both_divisions(method: str, division: str):
    """The CPU test's rule compiled, where the GPU machine's Triton 3.6 writes -y as 0 - y (the cause of
    the knob test's four failures in issue #37): every rotated zero written as 0x00."""
    written, in_negative_columns = _bytes_at_rotated_zeros("cuda", method, division)
    assert in_negative_columns > 0, "the rows must cancel in columns of negative sign"
    assert written.numel() > 0 and (written == 0x00).all(), sorted(set(written.tolist()))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["bf16 pairs", "fp16 pairs", "random fp32", "tiny and infinite scales"])
def test_gpu_reciprocal_division_is_ieee_division_with_the_hardware_fma(case: str):
    """The CPU tests' division checks on the GPU, where the fma is the hardware's single rounding
    (the interpreter emulates it in fp64): every bf16 and fp16 value pair with one correction, random
    fp32 pairs with two, tiny and infinite scales with both; against the CPU's IEEE division."""
    if case.endswith("pairs"):
        dtype = torch.bfloat16 if case.startswith("bf16") else torch.float16
        x, scale = _every_value_pair(dtype, (0, 5, 9, 12))
        runs = [(x, scale, fused.UNROTATED_CORRECTIONS)]
    elif case == "random fp32":
        generator = torch.Generator().manual_seed(1)
        size = 1 << 24
        x = (torch.rand(size, generator=generator) + 1) * torch.where(
            torch.rand(size, generator=generator) < 0.5, -1, 1
        )
        scale = (torch.rand(size, generator=generator) + 1) * 2.0**-9
        runs = [(x, scale, fused.ROTATED_CORRECTIONS)]
    else:
        x, scale = _edge_scale_pairs()
        runs = [(x, scale, fused.UNROTATED_CORRECTIONS), (*_without_zeros(x, scale), fused.ROTATED_CORRECTIONS)]
    for x, scale, corrections in runs:
        got = _reciprocal_division(x.cuda(), scale.cuda(), corrections).cpu()
        wrong = ~_same_bits(got, x / scale)
        assert not wrong.any(), (corrections, x[wrong][:5], scale[wrong][:5], got[wrong][:5])


# ----------------------------------------------------------------------------------------------------
# The rungs: their emulation reads what their kernel reads
# ----------------------------------------------------------------------------------------------------
RUNG_MODULES = ["triton_impl.fp8", "triton_impl.gluon.fp8", "cute_impl.fp8"]


def _rung_layout(module, problem: Problem) -> fp8.ValueLayout:
    if hasattr(module, "VALUE_LAYOUT"):
        return module.VALUE_LAYOUT
    return module.value_layout(module.default_config(problem))


@pytest.mark.parametrize("module_name", RUNG_MODULES)
def test_each_rungs_emulation_quantises_with_the_fused_quantiser_in_its_layout(
    module_name: str, monkeypatch: pytest.MonkeyPatch
):
    """Under the interpreter as on CUDA, ``emulate`` gets the fused quantiser's bytes and scales (V
    back in rows), in the rung's own V layout: the operands its kernel reads."""
    if module_name == "cute_impl.fp8":
        pytest.importorskip("cutlass")
    module = __import__(module_name, fromlist=["emulate"])
    problem = Problem(1, 2, 70, 140, 128, dtype=torch.bfloat16, kv_heads=1)
    q, k, v = _inputs(problem)
    seen = {}
    # Every FP8 rung's emulate is the shared entry's (triton_impl/fp8_launch.py).
    monkeypatch.setattr(
        fp8_launch, "emulate_quantised", lambda operands, *args, **kwargs: seen.setdefault("ops", operands)
    )
    quantise_fused = fused.quantise_fused
    monkeypatch.setattr(
        fused, "quantise_fused", lambda *args: seen.setdefault("layout", args[4]) and quantise_fused(*args)
    )
    module.emulate(q, k, v, problem)
    layout = _rung_layout(module, problem)
    assert seen["layout"] == layout, "the emulation did not quantise with the fused quantiser in the rung's layout"
    expected = fused.quantise_fused(q, k, v, module.DEFAULT_QUANTISATION, layout).as_quantised()
    for name in ("q8", "k8", "v8", "q_scale", "k_scale", "v_scale"):
        got, want = getattr(seen["ops"], name), getattr(expected, name)
        if got.dtype == torch.float8_e4m3fn:
            got, want = got.view(torch.uint8), want.view(torch.uint8)
        assert torch.equal(got, want), name
