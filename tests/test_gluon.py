"""Checks specific to the Gluon rungs (gluon/hopper, gluon/fp8) beyond the shared rung tests.

CPU: every supported variant of both rungs compiles for sm_90a with the instructions its design
claims (TMA, mbarriers, wgmma, setmaxnreg with the partition budgets; e4m3 wgmma for gluon/fp8, in
every quantisation variant) and without spills; capability checks and input validation. Gluon has
no interpreter path, and the interpreter that the CPU test session turns on breaks Gluon
compilation, so the compiles run in a child process without it.
GPU (``gpu`` marker): LSE against the fp64 reference (gluon/fp8: of its dequantised operands), the
prepared launch reused on new inputs, and the problem features (GQA with kv_heads 1 and 4, both causal
alignments with Sq != Sk, ragged cache_seqlens including 0 and Sk, the returned LSE) through the
shared check. gluon/fp8's O is judged by ``tests/test_fp8_rungs.py`` and
the shared rung tests (``FP8_RULE`` against ``common.contract.fp8.emulate``).
"""

from __future__ import annotations

import json

import pytest
import torch

from common.contract.check import check_on_inputs
from common.contract.fp8 import VARIANTS, KernelOrder, dequantised, quantise
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import discover
from tests._helpers import child_result, require_supported, scripts_in_one_child
from triton_impl import fp8_launch
from triton_impl.gluon import fp8, hopper
from triton_impl.gluon._host import LOAD_REGISTERS

# The compile fixture runs once, for every variant, in one pytest-xdist worker (--dist loadgroup).
pytestmark = [pytest.mark.xdist_group("gluon-compile"), pytest.mark.static, pytest.mark.release]
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
# (rung, head_dim, causal, dtype name, fp8 quantisation, features) variants compiled on the CPU;
# ``features``: GQA, the bottom-right alignment, cache_seqlens and the LSE (``FEATURE_PROBLEM``).
COMPILED = [
    ("hopper", 128, False, "bf16", None, False),
    ("hopper", 128, True, "bf16", None, False),
    ("hopper", 64, False, "fp16", None, False),
    ("hopper", 64, True, "bf16", None, False),
    ("fp8", 128, False, "bf16", "rotation", False),
    ("fp8", 128, True, "bf16", "block+rotation", False),
    ("fp8", 64, False, "fp16", "per-tensor", False),
    ("fp8", 64, True, "bf16", "block", False),
    ("hopper", 128, True, "bf16", None, True),
    ("fp8", 128, True, "bf16", "block+rotation", True),
]
FEATURES = {
    "heads": 4,
    "kv_heads": 1,
    "causal_alignment": "bottom_right",
    "has_cache_seqlens": True,
    "return_lse": True,
}

_COMPILE_SCRIPT = """
import json, re, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, ptx_features
from common.contract.fp8 import VARIANTS
from triton_impl.gluon import fp8, hopper
rung, head_dim, causal, dtype, variant, features = json.loads(sys.argv[1])
shape = {"batch": 1, "heads": 1, "seqlen_q": 256, "seqlen_k": 256, **features}
problem = Problem(head_dim=head_dim, dtype=getattr(torch, dtype), causal=causal, **shape)
if rung == "fp8":
    (binary,) = fp8.compile_sm90(problem, quantisation=VARIANTS[variant])
else:
    (binary,) = hopper.compile_sm90(problem)
(resources,) = cubin_resources(binary.cubin).values()
sass = cubin_sass(binary.cubin)
tokens = (("init", "mbarrier.init"), ("fence", "fence.proxy.async"), ("wait", "mbarrier.try_wait"))
events = [kind for line in binary.ptx.splitlines() for kind, token in tokens if token in line]
instructions = [
    (m.group(1), [a.strip().split(".")[0] for a in m.group(2).split(",")])
    for m in re.finditer(r"/\\*[0-9a-f]{4,}\\*/\\s+(?:@!?U?P\\w+\\s+)?([A-Z][\\w.]*)\\s+([^;]*);", sass)
]
print(json.dumps({
    "instructions": instructions,
    "barrier_events": events,
    "one_group_in_flight": "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass,
    "features": ptx_features(binary.ptx),
    "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\\S*\\s+(\\d+)", binary.ptx)}),
    "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
    "rung": rung,
    "head_dim": head_dim,
    "causal": causal,
    "shared_bytes": binary.shared_bytes,
}))
"""


def _compile_spec(rung: str, head_dim: int, causal: bool, dtype_name: str, variant: str | None, features: bool) -> str:
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[dtype_name]
    return json.dumps([rung, head_dim, causal, torch_dtype, variant, FEATURES if features else {}])


COMPILED_IDS = [
    f"{r}-d{d}-{'causal' if c else 'full'}-{t}{'-' + v if v else ''}{'-features' if f else ''}"
    for r, d, c, t, v, f in COMPILED
]


@pytest.fixture(scope="session")
def builds() -> dict[str, dict]:
    """Every COMPILED variant and every LAUNCHES probe in one child process (one import of torch, Triton
    and the rungs for the module; the module's tests share one pytest-xdist worker), keyed
    ``compile/<variant id>`` and ``launch/<probe id>``; read one entry with ``child_result``."""
    scripts = {
        f"compile/{name}": (_COMPILE_SCRIPT, [_compile_spec(*spec)])
        for name, spec in zip(COMPILED_IDS, COMPILED, strict=True)
    }
    scripts |= {f"launch/{name}": (_LAUNCH_SCRIPT, [json.dumps(spec)]) for name, spec in LAUNCHES.items()}
    return scripts_in_one_child(scripts, timeout=1800)


@pytest.fixture(scope="module", params=COMPILED_IDS)
def compiled(request: pytest.FixtureRequest, builds: dict[str, dict]) -> dict:
    return child_result(builds, f"compile/{request.param}")


# ----------------------------------------------------------------------------------------------
# Static compile (CPU)
# ----------------------------------------------------------------------------------------------
def test_ptx_has_tma_barriers_wgmma_and_register_budgets(compiled: dict):
    features = compiled["features"]
    for name in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert features[name], f"PTX lacks {name}"
    assert not features["cp.async"], "PTX uses per-thread cp.async copies instead of TMA"
    # gluon/fp8's wgmmas read e4m3; gluon/hopper's, from the same kernel source, do not.
    assert features["e4m3 mma"] == (compiled["rung"] == "fp8"), "e4m3 wgmma where it does not belong, or missing"
    # The load warp gives registers up, the consumer warpgroups take them (setmaxnreg per partition).
    assert LOAD_REGISTERS.value in compiled["setmaxnreg"], compiled["setmaxnreg"]
    problem = Problem(1, 1, 256, 256, compiled["head_dim"], causal=compiled["causal"])
    config = fp8.default_config(problem) if compiled["rung"] == "fp8" else hopper.DEFAULT_CONFIGS[problem.head_dim]
    consumer_registers = config.consumer_registers
    assert consumer_registers in compiled["setmaxnreg"], compiled["setmaxnreg"]


def test_wgmmas_stay_asynchronous(compiled: dict):
    # The P V wgmma runs under the next block's softmax: a wait that leaves one wgmma group in flight.
    # ptxas serialises every wgmma of a kernel (each followed by a wait for none in flight) when other
    # instructions touch a running wgmma's registers; gluon/fp8's P once did (docs/perf-log.md).
    assert compiled["one_group_in_flight"], "no wgmma wait leaves a group in flight: serialised wgmmas"


def barrier_inits_fenced(events: list[str]) -> bool:
    """True when a proxy fence lies between the last mbarrier.init and the first mbarrier wait
    (``events``: "init", "fence" and "wait" in PTX order)."""
    last_init = max(index for index, event in enumerate(events) if event == "init")
    first_wait = events.index("wait", last_init)
    return "fence" in events[last_init:first_wait]


def test_barrier_inits_are_fenced_before_use(compiled: dict):
    # mbarrier.init is a generic-proxy write and the TMA copies complete the barriers through the
    # async proxy: the PTX memory model orders the two only through fence.proxy.async (Triton's own
    # TMA pipeline emits it after its inits; Gluon leaves it to the kernel).
    assert barrier_inits_fenced(compiled["barrier_events"]), compiled["barrier_events"][:40]


def test_barrier_fence_rule_catches_a_missing_fence():
    fenced = ["init", "init", "fence", "wait", "wait", "fence"]
    assert barrier_inits_fenced(fenced)
    # The kernel before the fix: the only fence is the epilogue's, after the first wait.
    assert not barrier_inits_fenced(["init", "init", "wait", "wait", "fence"])


def merges_from_unwritten_registers(instructions: list[tuple[str, list[str]]]) -> list[str]:
    """F2FP ... MERGE_C instructions (two values packed into one half of a register, the other half
    taken from their last operand) whose merge register no earlier instruction of the listing writes
    (``instructions``: SASS opcode and operands in listing order)."""
    written = {"RZ"}
    unwritten = []
    for opcode, operands in instructions:
        if opcode.startswith("F2FP") and "MERGE_C" in opcode and operands[-1] not in written:
            unwritten.append(f"{opcode} {', '.join(operands)}")
        if operands and operands[0].startswith("R") and not opcode.startswith(("ST", "RED", "ATOM")):
            written.add(operands[0])
    return unwritten


def test_p_words_read_no_unwritten_register(compiled: dict):
    # Triton 3.6's ptxas once built FP8 P words from a register it never wrote (the kernel Triton
    # specialised for seqlen_k = 1): garbage e4m3 P, non-finite rows on the H200 (docs/perf-log.md).
    assert not merges_from_unwritten_registers(compiled["instructions"])


def test_unwritten_merge_rule_catches_the_sk1_build():
    # The instructions of that build (Triton 3.6, D=64, seqlen_k folded to 1), R3 never written.
    sk1 = [
        ("MUFU.EX2", ["R13", "R13"]),
        ("MUFU.EX2", ["R24", "R24"]),
        ("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C", ["R56", "R13", "R24", "R3"]),
        ("PRMT", ["R3", "R56", "0x7632", "R3"]),
        ("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C", ["R58", "R13", "R13", "R3"]),
    ]
    assert merges_from_unwritten_registers(sk1) == ["F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R56, R13, R24, R3"]
    assert not merges_from_unwritten_registers([("MOV", ["R3", "RZ"]), *sk1])


def longest_max_chain(instructions: list[tuple[str, list[str]]]) -> int:
    """The most FMNMX in one dependent chain (each reading the previous one's result), in program order,
    within one stretch of straight-line code. Any other instruction writing a register (its first operand)
    ends the chain through it, and a branch ends every chain: program order past a branch is not execution
    order (Triton 3.7 and 3.8 lay the peeled first step and a later block out so that a linear scan joined
    their trees into one chain of 16 across three branches)."""
    depth: dict[str, int] = {}
    longest = 0
    for opcode, operands in instructions:
        if opcode == "BRA":
            depth.clear()
        elif opcode.startswith("FMNMX"):
            depth[operands[0]] = 1 + max(depth.get(source, 0) for source in operands[1:3])
            longest = max(longest, depth[operands[0]])
        elif operands:
            depth[operands[0]] = 0
    return longest


def test_fp8_row_max_is_a_tree(compiled: dict):
    # gluon/fp8's softmax waits on its row max (docs/perf-log.md, "Fourth stop"): Triton
    # 3.6 chains gl.max over a thread's 32 columns, so its configurations take the hand-made tree
    # (row_tree, 34 FMNMX in a chain without it). The longest chain left is a tree's: 5 levels in the
    # thread, 2 across lanes, the running maximum and the mask (8-9 measured).
    problem = Problem(1, 1, 256, 256, compiled["head_dim"], causal=compiled["causal"])
    if compiled["rung"] != "fp8" or not fp8.default_config(problem).row_tree:
        pytest.skip("gl.max here: no gain measured from the tree (bf16; gluon/fp8 D=128 under Triton 3.9)")
    assert longest_max_chain(compiled["instructions"]) <= 12


def test_max_chain_rule_catches_a_chain():
    chain = [("FMNMX", [f"R{n + 1}", f"R{n}", f"R{100 + n}", "!PT"]) for n in range(32)]
    assert longest_max_chain(chain) == 32
    tree = [("FMNMX", [f"R{200 + n}", f"R{2 * n}", f"R{2 * n + 1}", "!PT"]) for n in range(16)]
    tree += [("FMNMX", [f"R{300 + n}", f"R{200 + 2 * n}", f"R{201 + 2 * n}", "!PT"]) for n in range(8)]
    assert longest_max_chain(tree) == 2
    # A register rewritten by another instruction ends the chain through it.
    assert longest_max_chain([*chain[:16], ("MOV", ["R16", "RZ"]), *chain[16:]]) == 16
    # So does a branch.
    assert longest_max_chain([*chain[:10], ("BRA", ["0x50c0"]), *chain[10:]]) == 22


def test_no_spills_and_shared_memory_fits(compiled: dict):
    # ptxas puts a setmaxnreg kernel's spills on the stack (common.reporting.static counts both the same way).
    assert compiled["spill_bytes"] == 0, f"spills {compiled['spill_bytes']} bytes per thread"
    assert compiled["shared_bytes"] <= 232_448, f"needs {compiled['shared_bytes']} B of shared memory"


_LAUNCH_SCRIPT = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature
from triton_impl.fp8_quantiser import quantise_for_kernel
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, ptx_features
from triton_impl.gluon import fp8, hopper
from triton_impl.gluon.hopper import attention_kernel as kernel
from common.contract.inputs import make_cache_seqlens
rung, seqlen_q, seqlen_k, head_dim, causal, features = json.loads(sys.argv[1])
problem = Problem(2, 4, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=causal, **features)
q, k, v = make_inputs(problem, seed=1, device="cpu")
lengths = make_cache_seqlens(problem, seed=1, device="cpu") if problem.has_cache_seqlens else None
if rung == "fp8":
    # The kernel over the operands bind's quantiser writes (on this CPU: the torch reference, same layout).
    config = fp8.default_config(problem)
    operands = quantise_for_kernel(q, k, v, fp8.DEFAULT_QUANTISATION, fp8.value_layout(config))
    launch = fp8.GluonFp8Attention(operands, problem, config, lengths)
else:
    launch = hopper.GluonAttention(q, k, v, problem, hopper.DEFAULT_CONFIGS[head_dim], lengths)
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
kwargs = {**launch._options, "debug": False}
binder = create_function_from_signature(kernel.signature, kernel.params, backend)
bound, specialization, options = binder(*launch._args, **kwargs)
options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
(resources,) = cubin_resources(compiled.asm["cubin"]).values()
print(json.dumps({
    "e4m3": ptx_features(compiled.asm["ptx"])["e4m3 mma"],
    "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
    "scale_types": [signature[name] for name in hopper.SCALE_ARGS],
    "seqlen_k_type": signature["seqlen_k"],
}))
"""


GQA_KV_CACHE = {"kv_heads": 2, "causal_alignment": "bottom_right", "has_cache_seqlens": True, "return_lse": True}
# The prepared launches compiled through Triton's JIT binder: (rung, seqlen_q, seqlen_k, head_dim, causal,
# features) by probe id.
LAUNCHES = {
    "hopper": ("hopper", 300, 517, 128, False, {}),
    "fp8": ("fp8", 300, 517, 128, False, {}),
    "fp8-one-key": ("fp8", 1, 1, 64, True, {}),
    "hopper-gqa-kv-cache": ("hopper", 77, 1000, 64, True, GQA_KV_CACHE),
    "fp8-gqa-kv-cache": ("fp8", 1000, 77, 128, True, GQA_KV_CACHE),
}


@pytest.mark.parametrize("probe", list(LAUNCHES))
def test_launch_arguments_compile_through_the_jit_binder(probe: str, builds: dict[str, dict]):
    """What ``attention_kernel[grid](*args, **options)`` would compile from each rung's prepared
    launch (on CPU tensors: Triton's own binder and argument packing, no driver): the host
    arguments and the kernel's parameters agree, fp16/bf16 passes the FP8 scales as None constexprs,
    and the GQA / KV-cache launches (kv_heads, cache_seqlens) bind too."""
    rung = LAUNCHES[probe][0]
    result = child_result(builds, f"launch/{probe}")
    assert result["e4m3"] == (rung == "fp8")
    assert result["spill_bytes"] == 0, result
    if rung == "hopper":
        assert result["scale_types"] == ["constexpr"] * len(hopper.SCALE_ARGS)
    # One kernel for every key length: Triton would fold seqlen_k = 1 into a kernel of its own (the
    # build whose P words Triton 3.6's ptxas got wrong, test_unwritten_merge_rule_catches_the_sk1_build).
    assert result["seqlen_k_type"] == "i32", result["seqlen_k_type"]


# ----------------------------------------------------------------------------------------------
# Registry, capability checks and validation (CPU)
# ----------------------------------------------------------------------------------------------
def test_fp8_register_rename_matches_the_host_key_order():
    """gluon/fp8 hands P to P V by renaming S's registers (``fp8.scores_as_operand``: a reshape /
    permute of the key bits); V's keys must be stored in the order that permutation gives
    (``common.contract.fp8.value_operand``), or the product pairs P and V of different keys."""
    from common.contract.fp8 import KEY_GROUP, PERMUTED_KEY_ORDER
    from triton_impl.gluon.fp8 import KEY_BIT_ORDER

    block_n = 128
    keys = torch.arange(block_n).reshape(1, block_n // KEY_GROUP, 2, 2, 2, 2)
    renamed = keys.permute(KEY_BIT_ORDER.value).reshape(block_n)
    expected = torch.tensor([g * KEY_GROUP + k for g in range(block_n // KEY_GROUP) for k in PERMUTED_KEY_ORDER])
    assert torch.equal(renamed, expected), (renamed[:KEY_GROUP], expected[:KEY_GROUP])
    # The identity order (V not permuted) would not match: the check can fail.
    assert not torch.equal(torch.arange(block_n), expected)


def test_registry_lists_the_gluon_stack():
    available, missing = discover(include_baselines=False)
    names = {impl.name: impl for impl in available}
    assert names["gluon/hopper"].stack == "gluon"
    assert names["gluon/hopper"].bind is not None
    assert names["gluon/fp8"].stack == "gluon" and names["gluon/fp8"].rung == "fp8"
    assert not [m for m in missing if "gluon" in m.module], missing


def test_cpu_is_refused_with_reason():
    ok, reason = hopper.IMPLEMENTATION.check(Problem(1, 2, 64, 64, 128), torch.device("cpu"))
    assert not ok
    assert "GPU" in reason


def test_unsupported_head_dim_is_refused_with_reason():
    ok, reason = hopper.supports(Problem(1, 2, 64, 64, 256), torch.device("cuda"))
    assert not ok
    assert "head_dim" in reason and "256" in reason


def test_fp32_is_refused_with_reason():
    ok, reason = hopper.supports(Problem(1, 2, 64, 64, 128, dtype=torch.float32), torch.device("cuda"))
    assert not ok
    assert "fp32" in reason


def test_bad_dtype_raises_naming_expected_and_given():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float32, device=DEVICE)
    with pytest.raises(TypeError, match=r"bf16, fp16.*got fp32"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.float32))


def test_cpu_tensors_raise_naming_the_device():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"tensors must be on a cuda device, got cpu"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.float16))


@pytest.mark.gpu
def test_bad_head_dim_raises_naming_expected_and_given():
    q = torch.zeros(1, 2, 16, 96, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match=r"head_dim must be one of \[64, 128\], got 96"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 96, dtype=torch.float16))


def test_fp8_capability_checks_give_reasons():
    cuda = torch.device("cuda")
    ok, reason = fp8.IMPLEMENTATION.check(Problem(1, 2, 64, 64, 128), torch.device("cpu"))
    assert not ok and "GPU" in reason
    ok, reason = fp8.supports(Problem(1, 2, 64, 64, 256), cuda)
    assert not ok and "gluon/fp8" in reason and "256" in reason
    ok, reason = fp8.supports(Problem(1, 2, 64, 64, 128, dtype=torch.float32), cuda)
    assert not ok and "fp16 or bf16" in reason and "fp32" in reason


def test_fp8_bad_inputs_raise_naming_expected_and_given():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float32, device=DEVICE)
    with pytest.raises(TypeError, match=r"bf16, fp16.*got fp32"):
        fp8.prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.float32))
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"tensors must be on a cuda device, got cpu"):
        fp8.prepare(q, q, q, Problem(1, 2, 16, 16, 64))


def test_fp8_block_scales_must_cover_whole_tiles():
    config = fp8.default_config(Problem(1, 1, 256, 256, 128))
    for q_rows, kv_rows in ((32, 128), (64, config.block_n // 2)):
        odd = VARIANTS["block"].__class__(block=True, rotation=False, q_block_rows=q_rows, kv_block_rows=kv_rows)
        with pytest.raises(ValueError, match=r"gluon/fp8: block quantisation.*consumer tile \(64 rows\)"):
            fp8.check_quantisation_blocks(odd, config)
    # Per-tensor scales are one value per tensor: any block rows will do.
    fp8.check_quantisation_blocks(VARIANTS["per-tensor"].__class__(block=False, q_block_rows=32), config)


def test_fp8_emulation_follows_the_kernel_order(monkeypatch: pytest.MonkeyPatch):
    """gluon/fp8 has triton/fp8's numerics (P from fp32 to e4m3 with 2^8 headroom, one fresh P V per
    key block, blocks first to last), so it is judged by the shared emulation with its own block size."""
    seen = {}
    record = lambda operands, problem, order, **_: seen.setdefault("order", order)  # noqa: E731
    monkeypatch.setattr(fp8_launch, "emulate_quantised", record)
    problem = Problem(1, 1, 70, 300, 64, dtype=torch.bfloat16, causal=True)
    q, k, v = make_inputs(problem, seed=3, device="cpu")
    fp8.emulate(q, k, v, problem)
    assert seen["order"] == KernelOrder(block_n=fp8.default_config(problem).block_n, reverse=False)


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77), (333, 333)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_gpu_lse_matches_reference(seqlens: tuple[int, int], causal: bool):
    problem = Problem(2, 3, *seqlens, 128, dtype=torch.bfloat16, causal=causal)
    require_supported(hopper.IMPLEMENTATION, problem, "cuda")
    q, k, v = make_inputs(problem, seed=5)
    run = hopper.prepare(q, k, v, problem)
    run.lse.fill_(float("nan"))
    run()
    _, lse_ref = reference_attention(q, k, v, problem, with_lse=True)
    error = (run.lse.double() - lse_ref).abs().max().item()
    assert error < 1e-2, f"max |lse - reference| = {error:.3g}"


def _bound_to_new_inputs(module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Problem, torch.Tensor]:
    """``module``'s bind on new inputs (seed 2) of a signature its prepare has planned (seed 1):
    (q, k, v, problem, O)."""
    problem = Problem(1, 2, 500, 700, 64, dtype=torch.float16, causal=True)
    require_supported(module.IMPLEMENTATION, problem, "cuda")
    module.prepare(*make_inputs(problem, seed=1), problem)
    q, k, v = make_inputs(problem, seed=2)
    return q, k, v, problem, module.bind(q, k, v, problem)()


@pytest.mark.gpu
def test_gpu_bind_runs_new_inputs_of_a_prepared_signature():
    q, k, v, problem, out = _bound_to_new_inputs(hopper)
    expected = reference_attention(q, k, v, problem)
    error = (out.double() - expected).abs().max().item()
    assert error < 2e-2, f"max |O - reference| = {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["per-tensor", "block+rotation"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77), (333, 333)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_gpu_fp8_lse_matches_its_dequantised_operands(seqlens: tuple[int, int], causal: bool, variant: str):
    """LSE of the e4m3 scores: against fp64 attention of the dequantised Q and K, the kernel's only
    error is the fp8 wgmma's accumulation (a missed 2^P_EXPONENT would be off by 5.5)."""
    problem = Problem(2, 3, *seqlens, 128, dtype=torch.bfloat16, causal=causal)
    require_supported(fp8.IMPLEMENTATION, problem, "cuda")
    q, k, v = make_inputs(problem, seed=6)
    quantisation = VARIANTS[variant]
    run = fp8.prepare(q, k, v, problem, quantisation)
    run.lse.fill_(float("nan"))
    run()
    operands = quantise(q, k, v, quantisation)
    q64 = dequantised(operands.q8, operands.q_scale, quantisation.q_block_rows)
    k64 = dequantised(operands.k8, operands.k_scale, quantisation.kv_block_rows)
    _, lse_ref = reference_attention(q64, k64, k64, problem, with_lse=True)
    error = (run.lse.double() - lse_ref).abs().max().item()
    assert error < 1e-2, f"max |lse - lse of the dequantised operands| = {error:.3g}"


@pytest.mark.gpu
def test_gpu_fp8_bind_runs_new_inputs_of_a_prepared_signature():
    q, k, v, problem, out = _bound_to_new_inputs(fp8)
    emulated = fp8.emulate(q, k, v, problem)
    excess = ((out.double() - emulated.out).abs() - emulated.bound).max().item()
    assert excess <= 0, f"O exceeds the emulation's bound by {excess:.3g}"


# The problem features: GQA (kv_heads 1 and 4 of 8 heads), both alignments with Sq != Sk, ragged
# cache lengths (0, Sk and two between), the LSE. Each through the shared check (poisoned buffers,
# fp64 reference, SDPA's error as the yardstick; gluon/fp8 against its fp64 emulation).
FEATURE_CASES = [
    pytest.param({"kv_heads": 4}, (333, 333), id="gqa4"),
    pytest.param({"kv_heads": 1}, (333, 700), id="mqa"),
    pytest.param({"causal_alignment": "top_left"}, (77, 1000), id="top-left-sq77-sk1000"),
    pytest.param({"causal_alignment": "top_left"}, (1000, 77), id="top-left-sq1000-sk77"),
    pytest.param({"causal_alignment": "bottom_right"}, (77, 1000), id="bottom-right-sq77-sk1000"),
    pytest.param({"causal_alignment": "bottom_right"}, (1000, 77), id="bottom-right-sq1000-sk77"),
    pytest.param({"causal_alignment": "bottom_right", "kv_heads": 2}, (1000, 1000), id="bottom-right-gqa2-square"),
    pytest.param({"has_cache_seqlens": True, "kv_heads": 4}, (77, 1000), id="cache-top-left"),
    pytest.param({"has_cache_seqlens": True, "causal_alignment": "bottom_right"}, (77, 1000), id="cache-bottom-right"),
    pytest.param(
        {"has_cache_seqlens": True, "causal_alignment": "bottom_right", "kv_heads": 1},
        (1000, 513),
        id="cache-mqa-sq-gt",
    ),
]
# Ragged lengths of the 4 sequences: none, all of the padded Sk, and two between (one not a block multiple).
CACHE_FRACTIONS = (0.0, 1.0, 0.5, 0.13)


def _feature_inputs(problem: Problem, seed: int):
    q, k, v = make_inputs(problem, seed=seed)
    if not problem.has_cache_seqlens:
        return q, k, v, None
    lengths = [round(fraction * problem.seqlen_k) for fraction in CACHE_FRACTIONS]
    return q, k, v, torch.tensor(lengths, dtype=torch.int32, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("features, seqlens", FEATURE_CASES)
def test_gpu_features_match_reference(features: dict, seqlens: tuple[int, int], causal: bool, head_dim: int):
    problem = Problem(4, 8, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal, return_lse=True, **features)
    ok, reason = hopper.IMPLEMENTATION.check(problem, torch.device("cuda"))
    assert ok, reason
    q, k, v, lengths = _feature_inputs(problem, seed=11)
    result = check_on_inputs(hopper.IMPLEMENTATION, q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, result.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("features, seqlens", FEATURE_CASES)
def test_gpu_fp8_features_match_emulation_and_lse(
    features: dict, seqlens: tuple[int, int], causal: bool, head_dim: int
):
    """O by the shared check against the fp64 emulation (which takes kv_heads, the alignment and the
    lengths); the LSE against fp64 attention of the dequantised operands, as in
    ``test_gpu_fp8_lse_matches_its_dequantised_operands`` (rows with no key: -inf exactly)."""
    problem = Problem(4, 8, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal, **features)
    ok, reason = fp8.IMPLEMENTATION.check(problem, torch.device("cuda"))
    assert ok, reason
    q, k, v, lengths = _feature_inputs(problem, seed=12)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, result.summary()

    with_lse = problem.with_(return_lse=True)
    out, lse = fp8.prepare(q, k, v, with_lse, cache_seqlens=lengths)()
    operands = quantise(q, k, v, fp8.DEFAULT_QUANTISATION)
    rows = fp8.DEFAULT_QUANTISATION
    q64 = dequantised(operands.q8, operands.q_scale, rows.q_block_rows)
    k64 = dequantised(operands.k8, operands.k_scale, rows.kv_block_rows)
    _, lse_ref = reference_attention(q64, k64, k64, with_lse, cache_seqlens=lengths, with_lse=True)
    assert torch.equal(lse == float("-inf"), lse_ref == float("-inf")), "rows seeing no key must have lse -inf"
    assert torch.isfinite(out.float()).all()
    finite = torch.isfinite(lse_ref)
    error = (lse.double() - lse_ref)[finite].abs().max().item() if finite.any() else 0.0
    assert error < 1e-2, f"max |lse - lse of the dequantised operands| = {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("rung", [hopper, fp8], ids=["hopper", "fp8"])
def test_gpu_gqa_reads_the_kv_head_not_a_copy(rung):
    """GQA's K/V are (B, Hkv, Sk, D): the same output as the problem with K and V repeated per query
    head (the kernel reads head h // group, so the two agree to the last bit for fp16/bf16)."""
    gqa = Problem(2, 8, 300, 517, 128, dtype=torch.bfloat16, causal=True, kv_heads=2)
    q, k, v = make_inputs(gqa, seed=13)
    out = rung.prepare(q, k, v, gqa)().clone()
    repeated = gqa.with_(kv_heads=8)
    expanded = (t.repeat_interleave(4, dim=1) for t in (k, v))
    out_repeated = rung.prepare(q, *expanded, repeated)()
    if rung is hopper:
        assert torch.equal(out, out_repeated)
    else:
        # fp8 quantises K and V per KV head either way (the repeat copies the blocks and their scales).
        assert (out.double() - out_repeated.double()).abs().max().item() < 1e-2


def test_gluon_rungs_accept_every_problem_feature():
    """Both rungs implement GQA, both alignments, cache_seqlens and the LSE: on a CPU device the only
    objection is the device, never a feature."""
    problem = Problem(2, 8, 77, 1000, 128, causal=True, kv_heads=2, causal_alignment="bottom_right",
                      has_cache_seqlens=True, return_lse=True)  # fmt: skip
    for module in (hopper, fp8):
        ok, reason = module.supports(problem, torch.device("cpu"))
        assert not ok and "needs a CUDA GPU" in reason, reason


def test_fp8_emulation_takes_the_problem_features():
    """common.contract.fp8.emulate with GQA, bottom-right and ragged lengths (0 among them): finite,
    0 on rows that see no key, close to fp64 attention of the dequantised operands elsewhere; K and V
    of the other KV head (a planted bug) are far from it."""
    from common.contract import fp8 as contract_fp8

    problem = Problem(3, 4, 70, 200, 64, causal=True, kv_heads=2, causal_alignment="bottom_right",
                      has_cache_seqlens=True)  # fmt: skip
    q, k, v = make_inputs(problem, seed=14, device="cpu")
    lengths = torch.tensor([0, 200, 45], dtype=torch.int32)
    quantisation = VARIANTS["block"]
    operands = quantise(q, k, v, quantisation)
    order = KernelOrder(block_n=64, reverse=False)
    emulated = contract_fp8.emulate(operands, problem, order, cache_seqlens=lengths)
    assert torch.isfinite(emulated.out).all() and torch.isfinite(emulated.bound).all()
    assert (emulated.out[0] == 0).all(), "a sequence of no keys must give O = 0"
    # Bottom-right with Sq = 70 > 45 keys: the first 25 rows of sequence 2 see none.
    assert (emulated.out[2, :, :25] == 0).all()
    q64, k64, v64 = (
        dequantised(x, s, r)
        for x, s, r in (
            (operands.q8, operands.q_scale, quantisation.q_block_rows),
            (operands.k8, operands.k_scale, quantisation.kv_block_rows),
            (operands.v8, operands.v_scale, quantisation.kv_block_rows),
        )
    )
    reference = reference_attention(q64, k64, v64, problem, cache_seqlens=lengths)
    assert (emulated.out - reference).abs().max().item() < 0.1
    wrong = contract_fp8.emulate(
        contract_fp8.QuantisedOperands(
            operands.q8, operands.k8.flip(1), operands.v8.flip(1), operands.q_scale,
            operands.k_scale.flip(1), operands.v_scale.flip(1), quantisation,
        ),
        problem, order, cache_seqlens=lengths,
    )  # fmt: skip
    assert (wrong.out - reference).abs().max().item() > 0.1


def test_fp8_takes_one_key():
    """gluon/fp8 once refused Sk = 1 (non-finite rows on the H200: Triton 3.6's ptxas miscompiled the
    kernel Triton specialised for seqlen_k = 1); its capability check and validation now accept it
    like every other key length."""
    from triton_impl.gluon import fp8 as gluon_fp8

    one_key = Problem(batch=1, heads=1, seqlen_q=300, seqlen_k=1, head_dim=128, dtype=torch.bfloat16)
    ok, reason = gluon_fp8.supports(one_key, torch.device("cpu"))
    assert not ok and "needs a CUDA GPU" in reason, reason
    q = torch.zeros(1, 1, 300, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 1, 1, 128, dtype=torch.bfloat16)
    # The only objection left on the CPU is the device, not the key length.
    with pytest.raises(ValueError, match="cuda device, got cpu"):
        gluon_fp8._validate(q, k, v, one_key)
