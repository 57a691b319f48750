"""The transformers adapter (common/integrations/transformers.py) on a tiny random-weight GQA Llama.

On CPU the Triton rungs run in the interpreter (tests/conftest.py sets TRITON_INTERPRET), in fp32,
against the same model with ``attn_implementation="sdpa"``; the yardstick for logits is the
distance between transformers' own eager and SDPA paths on the same input.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from tests.conftest import HAS_CUDA

transformers = pytest.importorskip("transformers")

from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache, LlamaConfig  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask  # noqa: E402

import common.integrations.transformers as adapter  # noqa: E402
from common.contract import dispatch  # noqa: E402
from common.contract.api import attention, clear_plan_cache  # noqa: E402
from common.contract.dispatch import DISPATCH_NAMES  # noqa: E402
from common.integrations.transformers import (  # noqa: E402
    PREFIX,
    ladder_mask,
    make_attention_forward,
    mask_pattern,
    register_attention_implementations,
)

# One worker builds the models and registers the implementations once for the whole module.
pytestmark = pytest.mark.xdist_group("transformers")

CPU_RUNGS = ("triton/naive", "triton/online", "triton/tiled", "triton/pipelined")
# The fastest rung under the interpreter carries the longer CPU tests.
FAST_RUNG = "triton/tiled"
PROMPT = 8
VOCAB = 128


def tiny_config(**changes: object) -> LlamaConfig:
    """2 layers, 4 query heads over 2 KV heads (GQA), head_dim 32 (the smallest the Triton rungs take)."""
    settings = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    settings.update(changes)
    return LlamaConfig(**settings)


def with_attention(reference: torch.nn.Module, attn_implementation: str) -> torch.nn.Module:
    """A copy of ``reference`` (same weights) running ``attn_implementation``. The config is copied:
    ``from_config`` sets ``_attn_implementation`` on the config it is given, which would switch the
    reference model too."""
    model = AutoModelForCausalLM.from_config(copy.deepcopy(reference.config), attn_implementation=attn_implementation)
    model.load_state_dict(reference.state_dict())
    return model.to(next(reference.parameters()).device, next(reference.parameters()).dtype).eval()


def register_planted(name: str, attention_fn) -> str:
    """A deliberately wrong adapter registered like the real ones (same mask function)."""
    full_name = f"ladder-test:{name}"
    AttentionInterface.register(full_name, make_attention_forward(FAST_RUNG, attention_fn))
    AttentionMaskInterface.register(full_name, ladder_mask)
    return full_name


def gqa_tiled(q, k, v, **kwargs):
    """Planted bug: query head h reads KV head h % Hkv (k/v tiled instead of interleaved)."""
    group = q.shape[1] // k.shape[1]
    return attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), **kwargs)


def top_left_always(q, k, v, **kwargs):
    """Planted bug: the cache's causal mask aligned top-left (SDPA's is_causal) instead of bottom-right."""
    return attention(q, k, v, **{**kwargs, "causal_alignment": "top_left"})


@pytest.fixture(scope="module")
def names() -> list[str]:
    return register_attention_implementations()


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(1))


def logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kwargs).logits


@pytest.fixture(scope="module")
def yardstick(reference, prompt) -> float:
    """How far transformers' eager path is from its SDPA path on this input (fp32: ~1e-7)."""
    eager = logits(with_attention(reference, "eager"), prompt)
    return max((eager - logits(reference, prompt)).abs().max().item(), 1e-7)


def chunked_prefill(model: torch.nn.Module, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Logits of ids[:, split:] computed against a DynamicCache holding ids[:, :split] (Sq < Sk)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :split], past_key_values=cache, use_cache=True)
        return model(ids[:, split:], past_key_values=cache, use_cache=True).logits


def greedy(model: torch.nn.Module, ids: torch.Tensor, tokens: int, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
    return out[:, ids.shape[1] :]


def test_every_registry_implementation_is_registered(names):
    from common.contract.registry import discover

    rungs = [PREFIX + implementation.name for implementation in discover(include_baselines=False)[0]]
    assert names == [*rungs, *(PREFIX + name for name in DISPATCH_NAMES)]
    assert "ladder:triton/pipelined" in names and "ladder:cute/hopper" in names and "ladder:auto" in names
    for name in names:
        assert name in AttentionInterface() and name in AttentionMaskInterface()
    # transformers reads these substrings itself (FlashAttention hub kernels, its SDPA path).
    with pytest.raises(ValueError, match="flash"):
        register_attention_implementations(["sdpa/flash"])


def test_set_attn_implementation_switches(names, reference):
    model = with_attention(reference, "sdpa")
    model.set_attn_implementation(PREFIX + FAST_RUNG)
    assert model.config._attn_implementation == PREFIX + FAST_RUNG
    assert reference.config._attn_implementation == "sdpa"  # the reference really is SDPA


@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_prefill_logits_match_sdpa(names, reference, prompt, yardstick, impl_name):
    got = logits(with_attention(reference, PREFIX + impl_name), prompt)
    distance = (got - logits(reference, prompt)).abs().max().item()
    assert distance <= 4 * yardstick, f"{impl_name}: {distance:.3g} vs eager-vs-sdpa {yardstick:.3g}"


def test_chunked_prefill_is_bottom_right(names, reference, prompt, yardstick):
    expected = chunked_prefill(reference, prompt, 5)
    got = chunked_prefill(with_attention(reference, PREFIX + FAST_RUNG), prompt, 5)
    assert (got - expected).abs().max().item() <= 4 * yardstick


@pytest.mark.parametrize("bug", [gqa_tiled, top_left_always], ids=["gqa-tiled", "top-left-cache"])
def test_planted_bug_is_caught(names, reference, prompt, yardstick, bug):
    """The comparisons above fail for an adapter that gets the head mapping or the alignment wrong."""
    planted = with_attention(reference, register_planted(bug.__name__, bug))
    distance = (chunked_prefill(planted, prompt, 5) - chunked_prefill(reference, prompt, 5)).abs().max().item()
    assert distance > 1000 * yardstick


def test_greedy_generate_matches_sdpa(names, reference, prompt):
    """generate(): a prefill, then one-token decode steps against a growing DynamicCache."""
    expected = greedy(reference, prompt[:1], 8)
    assert torch.equal(greedy(with_attention(reference, PREFIX + FAST_RUNG), prompt[:1], 8), expected)


def test_static_cache_maps_to_cache_seqlens(names, reference, prompt):
    """A StaticCache masks the slots not written yet: read as cache_seqlens, not refused."""
    expected = greedy(reference, prompt[:1], 3)
    model = with_attention(reference, PREFIX + FAST_RUNG)
    assert torch.equal(greedy(model, prompt[:1], 3, cache_implementation="static"), expected)


def compiled_greedy(model: torch.nn.Module, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    """generate() with a StaticCache and its decode step under torch.compile (one graph: fullgraph),
    on the CPU too (transformers compiles only on accelerators unless told)."""
    from transformers.generation.configuration_utils import CompileConfig

    config = CompileConfig(fullgraph=True, backend="eager", mode=None)
    config._compile_all_devices = True
    torch._dynamo.reset()
    return greedy(model, ids, tokens, cache_implementation="static", compile_config=config)


def test_compiled_static_cache_runs_each_layer_through_the_custom_op(names, reference, prompt, monkeypatch):
    """Under torch.compile the attention is the opaque op ``ladder::attention`` (Dynamo cannot trace
    the mask check or the launches): the decode step compiles as one graph, every layer's attention of
    every compiled step goes through the op, and the tokens equal SDPA's."""
    model = with_attention(reference, PREFIX + FAST_RUNG)
    calls = []
    for key, eager in list(adapter._EAGER_FORWARDS.items()):
        monkeypatch.setitem(adapter._EAGER_FORWARDS, key, lambda *args, run=eager: calls.append(1) or run(*args))
    tokens = 4
    assert torch.equal(compiled_greedy(model, prompt[:1], tokens), greedy(reference, prompt[:1], tokens))
    assert len(calls) == (tokens - 1) * model.config.num_hidden_layers


def test_compiled_attention_without_the_op_breaks_the_graph(names, reference, prompt, monkeypatch):
    """Planted: the compiled forward calling the eager code directly (no op) cannot be one graph."""
    monkeypatch.setattr(adapter, "compiled_attention", lambda name, *args: adapter._EAGER_FORWARDS[name](*args))
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"[Dd]ata.dependent"):
        compiled_greedy(with_attention(reference, PREFIX + FAST_RUNG), prompt[:1], 3)


def _capturing_as_on_a_gpu(device: object) -> bool:
    """``_capturing`` as a CUDA device runs it: while Dynamo traces, the question reaches
    ``torch.cuda.is_current_stream_capturing``, which Dynamo cannot trace; outside, no capture."""
    return torch.cuda.is_current_stream_capturing() if torch.compiler.is_compiling() else False


def test_compiled_mask_function_never_asks_cuda_while_tracing(names, reference, prompt, monkeypatch):
    """On a GPU the mask function's capture check was traced into the compiled decode step and broke
    its graph (several graphs, parts eager): it must see that it is compiling before asking CUDA."""
    monkeypatch.setattr(adapter, "_capturing", _capturing_as_on_a_gpu)
    tokens = 3
    model = with_attention(reference, PREFIX + FAST_RUNG)
    assert torch.equal(compiled_greedy(model, prompt[:1], tokens), greedy(reference, prompt[:1], tokens))


def test_mask_function_asking_cuda_first_breaks_the_compiled_graph(names, reference, prompt, monkeypatch):
    """Planted: the capture check before the compiling check (the order that broke the GPU's graph)."""
    monkeypatch.setattr(adapter, "_capturing", _capturing_as_on_a_gpu)

    def asks_cuda_first(*args: object, **kwargs: object) -> object:
        adapter._capturing(kwargs.get("device"))
        return adapter.ladder_mask(*args, **kwargs)

    name = PREFIX + FAST_RUNG
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, name, asks_cuda_first)
    # Dynamo refuses to trace the question (a graph break) or, in some releases, runs it on fake tensors and
    # fails there (torch 2.11 without a GPU): either way the step does not compile as one graph.
    with pytest.raises((torch._dynamo.exc.Unsupported, torch._dynamo.exc.TorchRuntimeError)):
        compiled_greedy(with_attention(reference, name), prompt[:1], 3)


def test_a_stack_name_serves_prefill_and_decode(names, monkeypatch):
    """``ladder:triton`` on a model whose head dim (64) the Triton decode and Hopper rungs take: the
    prompt runs on triton/hopper, each generated token on triton/decode, and both match SDPA."""
    # A plan an earlier test of this process made would answer these calls without a dispatch to record
    # (a growing cache's family keeps its choice once its rungs' checks ignore Sk).
    clear_plan_cache()
    chosen = []

    def recorded(name, problem, device):
        choice = real_resolve(name, problem, device)
        chosen.append((problem.seqlen_q, choice.implementation.name))
        return choice

    real_resolve = dispatch.resolve_choice
    monkeypatch.setattr(dispatch, "resolve_choice", recorded)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(tiny_config(head_dim=64), attn_implementation="sdpa").eval()
    ids = torch.randint(3, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    model = with_attention(reference, PREFIX + "triton")
    yardstick = max((logits(with_attention(reference, "eager"), ids) - logits(reference, ids)).abs().max().item(), 1e-7)
    assert (logits(model, ids) - logits(reference, ids)).abs().max().item() <= 4 * yardstick
    expected = greedy(reference, ids, 3)
    assert torch.equal(greedy(model, ids, 3), expected)
    assert torch.equal(greedy(model, ids, 3, cache_implementation="static"), expected)
    assert {(PROMPT, "triton/hopper"), (1, "triton/decode")} <= set(chosen), chosen
    assert {name for seqlen_q, name in chosen if seqlen_q == 1} == {"triton/decode"}


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_mask_is_refused(names, reference, prompt, side):
    mask = torch.ones_like(prompt)
    if side == "left":
        mask[0, :3] = 0
    else:
        mask[0, -3:] = 0
    model = with_attention(reference, PREFIX + FAST_RUNG)
    with pytest.raises(ValueError, match="padding masks"):
        logits(model, prompt, attention_mask=mask)


def test_dropout_and_softcap_are_refused():
    forward = make_attention_forward(FAST_RUNG)
    q = torch.zeros(1, 4, 2, 32)
    kv = torch.zeros(1, 2, 2, 32)
    with pytest.raises(ValueError, match="dropout"):
        forward(torch.nn.Module(), q, kv, kv, None, dropout=0.1)
    with pytest.raises(ValueError, match="softcap"):
        forward(torch.nn.Module(), q, kv, kv, None, softcap=30.0)


def test_mask_pattern_reads_cache_lengths():
    """Bottom-right causal over a prefix of each sequence's keys -> cache_seqlens; a mask of all keys -> None."""
    seqlen_q, seqlen_k = 3, 8
    lengths = torch.tensor([5, 8])
    keys = torch.arange(seqlen_k)
    rows = torch.arange(seqlen_q)[:, None]
    keep = (keys < lengths[:, None, None]) & (keys <= rows + lengths[:, None, None] - seqlen_q)
    causal, cache_seqlens = mask_pattern(keep[:, None], 2, seqlen_q, seqlen_k)
    assert causal and cache_seqlens.tolist() == [5, 8] and cache_seqlens.dtype == torch.int32
    additive = torch.zeros(2, 1, seqlen_q, seqlen_k).masked_fill(~keep[:, None], float("-inf"))
    assert mask_pattern(additive, 2, seqlen_q, seqlen_k)[1].tolist() == [5, 8]
    assert mask_pattern(torch.ones(1, 1, seqlen_q, seqlen_k, dtype=torch.bool), 2, seqlen_q, seqlen_k) == (False, None)
    # Top-left with Sq < Sk never sees the last keys: the same as bottom-right over the first Sq keys
    # (a StaticCache's prefill).
    top_left = (keys <= rows).expand(2, seqlen_q, seqlen_k)[:, None]
    assert mask_pattern(top_left, 2, seqlen_q, seqlen_k)[1].tolist() == [3, 3]
    window = (keys <= rows + 5) & (keys > rows + 2)  # a sliding window of 3 keys
    with pytest.raises(ValueError, match="not one the API can express"):
        mask_pattern(window.expand(2, seqlen_q, seqlen_k)[:, None], 2, seqlen_q, seqlen_k)


def prefix_mask(lengths: list[int], seqlen_k: int) -> torch.Tensor:
    """A StaticCache's one-token decode mask: sequence b sees its first lengths[b] slots."""
    return (torch.arange(seqlen_k) < torch.tensor(lengths)[:, None])[:, None, None, :]


def test_a_capture_reads_lengths_without_reading_the_mask(monkeypatch):
    """During a CUDA graph capture the mask's pattern comes from the same shape read before, and only
    its lengths are taken (on the device); a shape never read eagerly is refused."""
    monkeypatch.setattr(adapter, "_VERIFIED_PATTERNS", {})
    assert adapter._cached_mask_pattern(prefix_mask([5, 8], 16), 2, 1, 16, "t")[1].tolist() == [5, 8]
    monkeypatch.setattr(adapter, "_capturing", lambda device: True)
    monkeypatch.setattr(adapter, "mask_pattern", lambda *args: pytest.fail("a capture must not read the mask"))
    causal, lengths = adapter._cached_mask_pattern(prefix_mask([6, 9], 16), 2, 1, 16, "t")
    assert causal and lengths.tolist() == [6, 9] and lengths.dtype == torch.int32
    with pytest.raises(ValueError, match="first seen during a CUDA graph capture"):
        adapter._cached_mask_pattern(prefix_mask([6, 9], 32), 2, 1, 32, "t")


@pytest.mark.skipif(
    "q_length" not in inspect.signature(sdpa_mask).parameters,
    reason="this transformers passes cache_position, not q_length",
)
def test_mask_function_skips_plain_causal_without_building_it():
    ones = torch.ones(2, 8, dtype=torch.bool)
    sizes = dict(batch_size=2, kv_offset=0, mask_function=causal_mask_function, device="cpu")
    assert ladder_mask(q_length=8, kv_length=8, q_offset=0, attention_mask=ones, **sizes) is None  # prefill
    assert ladder_mask(q_length=3, kv_length=8, q_offset=5, attention_mask=ones, **sizes) is None  # chunk
    assert ladder_mask(q_length=1, kv_length=8, q_offset=7, attention_mask=None, **sizes) is None  # decode
    # A StaticCache of 16 slots holding 8 tokens: the mask is built (and read as cache_seqlens later).
    static = ladder_mask(q_length=1, kv_length=16, q_offset=7, attention_mask=ones, **sizes)
    assert static.shape == (2, 1, 1, 16) and static.sum().item() == 16
    ones[0, 0] = False  # left padding
    assert ladder_mask(q_length=8, kv_length=8, q_offset=0, attention_mask=ones, **sizes) is not None


@pytest.mark.skipif(
    "q_length" not in inspect.signature(sdpa_mask).parameters,
    reason="this transformers passes cache_position, not q_length",
)
@pytest.mark.parametrize(("q_length", "q_offset"), [(8, 0), (3, 5), (1, 7)])
def test_a_static_cache_mask_is_known_from_its_arguments_and_never_read(q_length, q_offset, monkeypatch):
    """A StaticCache's mask (16 slots, 8 tokens written): the attention takes its verdict from the mask
    function's arguments without reading it, and that verdict is the one reading it gives (a wrong length
    or alignment in the shortcut fails the comparison); padding among the written tokens makes it read."""
    ones = torch.ones(2, 8, dtype=torch.bool)
    sizes = dict(batch_size=2, kv_offset=0, mask_function=causal_mask_function, device="cpu", kv_length=16)
    static = ladder_mask(q_length=q_length, q_offset=q_offset, attention_mask=ones, **sizes)
    read = mask_pattern(static, 2, q_length, 16)
    monkeypatch.setattr(adapter, "mask_pattern", lambda *args: pytest.fail("the shortcut must not read the mask"))
    causal, lengths = adapter._cached_mask_pattern(static, 2, q_length, 16, "t")
    assert causal == read[0] and torch.equal(lengths, read[1]) and lengths.tolist() == [8, 8]
    monkeypatch.undo()
    ones[1, 2] = False  # padding among the written tokens: the mask is read, and refused
    padded = ladder_mask(q_length=q_length, q_offset=q_offset, attention_mask=ones, **sizes)
    with pytest.raises(ValueError, match="not one the API can express"):
        adapter._cached_mask_pattern(padded, 2, q_length, 16, "t")


def _gpu_reference(new_tokens: int):
    """The 2-layer bf16 SDPA model on the GPU (seeded), a 16-token prompt and its ``new_tokens`` greedy
    tokens: ``(model, prompt, tokens)``, what the ladder's attention must reproduce."""
    torch.manual_seed(0)
    config = tiny_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64
    )
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(3, VOCAB, (1, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    return reference, prompt, greedy(reference, prompt, new_tokens)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_bf16_greedy_generate_on_gpu(names):
    """2-layer bf16 model, 32 greedy tokens equal to SDPA's (a divergence is allowed only at a near tie)."""
    reference, prompt, expected = _gpu_reference(32)
    got = greedy(with_attention(reference, PREFIX + "triton/pipelined"), prompt, 32)
    if not torch.equal(got, expected):
        first = int((got != expected).int().argmax())
        context = torch.cat([prompt, expected[:, :first]], dim=1)
        top2 = logits(reference, context)[0, -1].float().topk(2).values
        assert (top2[0] - top2[1]).item() < 0.05, f"diverged at token {first} without a near tie"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", ["triton", "gluon", "cute", "auto"])
def test_bf16_generate_with_cuda_graphs_on_gpu(names, impl):
    """transformers' compiled StaticCache decode (torch.compile "reduce-overhead": CUDA graphs) through the
    custom op: it records (nothing a call keeps is left in the graph's pool: the adapter's mask verdict,
    the rungs' lasting buffers) and its tokens are SDPA's but at a near tie."""
    from transformers.generation.configuration_utils import CompileConfig

    reference, prompt, expected = _gpu_reference(16)
    torch._dynamo.reset()
    model = with_attention(reference, PREFIX + impl)
    got = greedy(model, prompt, 16, cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead"))
    if not torch.equal(got, expected):
        first = int((got != expected).int().argmax())
        context = torch.cat([prompt, expected[:, :first]], dim=1)
        top2 = logits(reference, context)[0, -1].float().topk(2).values
        assert (top2[0] - top2[1]).item() < 0.05, f"diverged at token {first} without a near tie"


def test_compiled_op_answers_in_autocasts_dtype() -> None:
    """Under autocast the op's fake (what torch.compile plans with) has the dtype the eager call returns."""
    q, k, v = torch.randn(1, 4, 3, 32), torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32)
    assert adapter._compiled_attention_shape("x", q, k, v, None, True, None).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        fake = adapter._compiled_attention_shape("x", q, k, v, None, True, None)
        eager = attention(q, k, v, causal=True, causal_alignment="bottom_right", impl=FAST_RUNG)
    assert fake.dtype == eager.dtype == torch.float16
    assert fake.shape == eager.transpose(1, 2).shape
