"""Which tensor a compiled StaticCache generate leaves in the CUDA graph pool, per stack, one process each.

tests/test_transformers_adapter.py::test_bf16_generate_with_cuda_graphs_on_gpu runs the four stacks in one
process, so a process-lifetime buffer is made by whichever stack runs first; here every case gets a
fresh process. Each case runs that test's tiny bf16 GQA Llama (its own helpers, imported) through
transformers' compiled StaticCache generate (torch.compile "reduce-overhead": CUDA graph trees) with the
allocator's history on (``torch.cuda.memory._record_memory_history`` and Inductor's
``cudagraph_trees_history_recording``), so a failure names the Python stack that allocated the block left
in the pool; the log then lists the live tensors at that address and what holds them (three levels of
``gc.get_referrers``). A case passing prints the rungs its plans chose and the cached placeholders.

Cases are ``stack:prompt:lasting``. ``prompt`` 16 runs the prompt on the stack's decode rung (Sq <= 16
against the 31-slot cache, with lengths: the fp32 LSE placeholder is made eagerly); the last step sees
every slot, so the mask function returns None (plain causal), Dynamo's guard on the mask fails, and that
step is compiled and warmed up anew; its plan (no lengths) binds the int32 ``CacheSeqlens`` placeholder,
first made inside that warm-up. 32
runs the prompt on a prefill rung (gluon/hopper makes no placeholder, so gluon/decode makes the fp32 one
in the first step's warm-up, as the 8k run did). ``lasting`` "side-stream" puts back the pre-fix
``lasting`` (a side stream of the caller's thread) for the Triton placeholder, "fixed" keeps the tree's.
Run: ``python -m bench.graph_leak --out $OUT/graph-leak`` (the cases in parallel, each stopped after
``CASE_TIMEOUT_S``; one log each and ``summary.txt``). Exit 0 when every "fixed" case records.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench import require_gpu

T = TypeVar("T")

CASES = (
    "triton:16:fixed",
    "gluon:16:fixed",
    "cute:16:fixed",
    "auto:16:fixed",
    "gluon:32:fixed",
    "triton:16:side-stream",
    "gluon:16:side-stream",
    "gluon:32:side-stream",
)
NEW_TOKENS = 16
CASE_TIMEOUT_S = 150
REFERRER_DEPTH = 3
REFERRERS_SHOWN = 6


def side_stream_lasting(factory: Callable[[], T], device: Any) -> T:
    """``common.contract.devices.lasting`` before the fix: the factory on a side stream of the caller's thread."""
    import torch

    device = torch.device(device)
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        made = factory()
    current.wait_stream(side)
    return made


def describe(obj: object) -> str:
    """One line naming a referrer: a module's globals, a cache, a function, a container's size."""
    if isinstance(obj, dict):
        if "__name__" in obj and "__builtins__" in obj:
            return f"globals of module {obj['__name__']}"
        return f"dict with keys {[str(key)[:60] for key in list(obj)[:4]]}"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    kind = type(obj).__name__
    if name:
        return f"{kind} {getattr(obj, '__module__', '')}.{name}"
    if isinstance(obj, (list, tuple, set)):
        return f"{kind} of {len(obj)}"
    return kind


def show_holders(target: object, depth: int, seen: set[int], indent: str = "    ") -> None:
    """Print what refers to ``target``, ``depth`` levels up (frames and this walk's own lists skipped)."""
    if depth == 0:
        return
    holders = [ref for ref in gc.get_referrers(target) if type(ref).__name__ != "frame" and id(ref) not in seen]
    seen.add(id(holders))
    for holder in holders[:REFERRERS_SHOWN]:
        seen.add(id(holder))
        print(f"{indent}<- {describe(holder)}")
        show_holders(holder, depth - 1, seen, indent + "    ")


def show_leaks(message: str) -> None:
    """The live CUDA tensors whose storage holds each address the pool check named, and their holders."""
    import torch

    addresses = [int(found) for found in re.findall(r"Data Pointer: (\d+)", message)]
    gc.collect()
    tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.is_cuda]
    for address in addresses:
        print(f"leak: block at {address}")
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() <= address < storage.data_ptr() + max(storage.nbytes(), 1):
                print(f"  tensor {tuple(tensor.shape)} {tensor.dtype} at {tensor.data_ptr()}")
                show_holders(tensor, REFERRER_DEPTH, {id(tensors)})


def show_plans_and_placeholders() -> None:
    from common.contract import api
    from triton_impl import _host

    for plan in list(api._PLANS._plans.values()):
        print(f"plan: {plan.implementation.name} for {plan.problem.describe()}")
    print(f"placeholders: {_host.placeholder.cache_info()}")


def run_case(case: str) -> int:
    """One case in this process (see the module docstring); 0 when the compiled generate records."""
    import torch
    import torch._inductor.config

    stack, prompt_length, variant = case.split(":")
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    torch._inductor.config.triton.cudagraph_trees_history_recording = True
    if variant == "side-stream":
        from triton_impl import _host

        _host.lasting = side_stream_lasting
    from transformers import AutoModelForCausalLM
    from transformers.generation.configuration_utils import CompileConfig

    from common.integrations.transformers import PREFIX, register_attention_implementations
    from tests.test_transformers_adapter import VOCAB, greedy, tiny_config, with_attention

    register_attention_implementations()
    torch.manual_seed(0)
    config = tiny_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64
    )
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to("cuda", torch.bfloat16).eval()
    generator = torch.Generator("cuda").manual_seed(1)
    prompt = torch.randint(3, VOCAB, (1, int(prompt_length)), device="cuda", generator=generator)
    expected = greedy(reference, prompt, NEW_TOKENS)
    model = with_attention(reference, PREFIX + stack)
    compile_config = CompileConfig(mode="reduce-overhead")
    try:
        got = greedy(model, prompt, NEW_TOKENS, cache_implementation="static", compile_config=compile_config)
    except RuntimeError as error:
        print(f"{case}: FAILED {str(error).splitlines()[0]}")
        print(error)
        show_leaks(str(error))
        show_plans_and_placeholders()
        return 1
    print(f"{case}: recorded; tokens equal to SDPA's: {torch.equal(got, expected)}")
    show_plans_and_placeholders()
    return 0


def verdict(log: str) -> str:
    lines = [line for line in log.splitlines() if ": recorded" in line or ": FAILED" in line]
    return lines[0] if lines else (log.strip().splitlines() or ["(no output)"])[-1]


def evidence(log: str) -> list[str]:
    """A failed case's lines worth reading in the call's output (the whole log stays in ``--out``): the
    allocation frames in this repository, the leaked tensors and their holders, the plans."""
    root = os.getcwd()
    marks = ("leak:", "tensor (", "<-", "plan:", "placeholders:", "FAILED")
    return [line for line in log.splitlines() if root in line or line.lstrip().startswith(marks)][-80:]


def run_all(cases: Sequence[str], out: Path) -> int:
    """Every case in its own process, all at once; one log per case, a summary, exit 0 when every
    "fixed" case recorded."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONPATH=os.getcwd())
    started = {}
    for case in cases:
        log = (out / f"{case.replace(':', '-')}.log").open("w")
        command = [sys.executable, "-m", "bench.graph_leak", "--case", case]
        started[case] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    summary, failed_fixed = [], []
    for case, (process, log) in started.items():
        try:
            code = process.wait(timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            code = "timeout"
        log.close()
        text = Path(log.name).read_text()
        summary.append(f"{case:24s} exit {code}: {verdict(text)}")
        if code != 0 and case.endswith(":fixed"):
            failed_fixed.append(case)
        if code != 0:
            print(f"--- {case}\n" + "\n".join(evidence(text)))
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    return 1 if failed_fixed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/graph-leak"), help="folder for the logs")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated stack:prompt:lasting cases")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require_gpu("bench.graph_leak")
    if args.case:
        return run_case(args.case)
    return run_all(args.cases.split(","), args.out)


if __name__ == "__main__":
    sys.exit(main())
