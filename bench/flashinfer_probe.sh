#!/usr/bin/env bash
# Can the flashinfer/decode baseline run on this (GPU) machine? Run there from the project root with
# what bench/prepare_flashinfer.sh wrote (or without it, to see only what the machine has):
#     carry [".gpu/flashinfer"], command: bash bench/flashinfer_probe.sh 2>&1 | tee $OUT/flashinfer-probe.log
# Prints what FlashInfer's JIT needs (nvcc, a host C++ compiler, ninja, the driver's libcuda to link
# against, the Python packages it imports), then imports flashinfer and plans and runs its bf16 D=128
# decode on both paths (CUDA-core, tensor-core), timing the first call (AOT load or JIT build), and
# ends with one line: VERDICT: ...
set -u
cuda_home=""
for dir in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
  if [[ -x $dir/bin/nvcc ]]; then cuda_home=$dir; break; fi
done
missing=()
echo "== machine"
python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, 'CUDA', torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
echo "== CUDA compiler (FlashInfer's JIT runs \$CUDA_HOME/bin/nvcc; CUDA_HOME=${CUDA_HOME:-unset})"
if [[ -n $cuda_home ]]; then
  echo "toolkit: $cuda_home"; "$cuda_home/bin/nvcc" --version | tail -2
  ls -d "$cuda_home"/lib64/libcudart.so* "$cuda_home"/include/cuda_runtime.h 2>&1 | head -3
else
  echo "no nvcc in \$CUDA_HOME, /usr/local/cuda or /usr/local/cuda-*; on PATH: $(command -v nvcc || echo none)"; missing+=(nvcc)
fi
echo "== host C++ compiler"
if command -v c++ >/dev/null; then c++ --version | head -1; else echo "no c++"; missing+=("c++"); fi
echo "== ninja"
if command -v ninja >/dev/null; then echo "ninja $(ninja --version)"; else echo "no ninja on PATH"; missing+=(ninja); fi
echo "== the driver's libcuda (JIT modules link with -lcuda)"
ldconfig -p 2>/dev/null | grep -E 'libcuda\.so(\.1)? ' || { echo "libcuda.so.1 not in the linker cache"; missing+=(libcuda); }
echo "== Python packages flashinfer imports"
python3 - <<'EOS'
import importlib
for name in ("tvm_ffi", "einops", "tabulate", "requests", "pynvml", "jinja2", "packaging", "numpy", "ninja"):
    try:
        module = importlib.import_module(name)
        print(f"{name}: {getattr(module, '__version__', 'present')}")
    except Exception as error:  # noqa: BLE001 - report every missing package
        print(f"{name}: MISSING ({type(error).__name__}: {error})")
EOS
echo "== flashinfer"
if [[ -f .gpu/flashinfer/activate.sh ]]; then
  # shellcheck disable=SC1091
  source .gpu/flashinfer/activate.sh || echo "activate.sh failed (parts not stashed?)"
else
  echo "no .gpu/flashinfer/activate.sh in this tree (bench/prepare_flashinfer.sh writes it; carry it)"
fi
MISSING="${missing[*]}" python3 - <<'EOS'
import os
import time

import torch

from common.measure import flashinfer as baseline

missing = os.environ.get("MISSING", "").split()
toolchain = "JIT toolchain complete" if not missing else f"JIT toolchain lacks: {', '.join(missing)}"
available, reason = baseline.availability()
if not available:
    print(reason)
    print(f"VERDICT: flashinfer is not usable here ({reason}); {toolchain}")
    raise SystemExit(0)
print(baseline.flashinfer_version_info())
jit_dir = os.environ.get("FLASHINFER_WORKSPACE_BASE", "~")
results = []
for tensor_cores in (False, True):
    path = "tensor-core" if tensor_cores else "CUDA-core"
    start = time.time()
    ok, why = baseline._builds(torch.bfloat16, 128, tensor_cores, torch.device("cuda"))
    seconds = time.time() - start
    print(f"bf16 D=128 {path}: {'ok' if ok else why} ({seconds:.0f} s for the first plan and run)")
    results.append((path, ok, why, seconds))
built = sorted(p.name for p in __import__("pathlib").Path(os.path.expanduser(jit_dir)).glob(".cache/flashinfer/*/*/cached_ops/*"))
print("JIT-built here:", built or "nothing (the modules came from data/aot)")
failed = [(path, why) for path, ok, why, _ in results if not ok]
if failed:
    print(f"VERDICT: flashinfer/decode cannot run here: {failed[0][0]}: {failed[0][1]}; {toolchain}")
else:
    times = ", ".join(f"{path} ready in {seconds:.0f} s" for path, _, _, seconds in results)
    print(f"VERDICT: flashinfer/decode runs here ({times}; {toolchain})")
EOS
