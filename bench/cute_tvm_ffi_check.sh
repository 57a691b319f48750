#!/usr/bin/env bash
# GPU check of the CuTe rungs' TVM-FFI launch path (issues #39/#38; about 3 minutes on an H200):
#   1. the launch path's environment: torch's DLPack exchange API, TVM-FFI, e4m3 tensors through DLPack;
#   2. every CuTe rung's launch (forward rungs one case each, decode under a CUDA-graph capture with and
#      without pages, FP8 with cache_seqlens and the LSE, the three backward rungs);
#   3. the host time per call of attention() (binding + launch) for cute/decode and cute/hopper against
#      triton/decode, gluon/decode and SDPA at a decode step and a small prefill.
# Usage: OUT=/some/folder bash bench/cute_tvm_ffi_check.sh   (writes env.txt, gpu-tests.log, api-overhead/)
set -uo pipefail
: "${OUT:?set OUT to the folder for the logs}"
mkdir -p "$OUT"
status=0

python - >"$OUT/env.txt" 2>&1 <<'PY' || status=1
import torch
print("torch", torch.__version__, "exchange API before tvm_ffi:", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
import tvm_ffi
print("tvm_ffi", tvm_ffi.__version__, "exchange API:", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
e4m3 = tvm_ffi.from_dlpack(torch.zeros(4, 16, dtype=torch.float8_e4m3fn, device="cuda"))
print("e4m3 through DLPack:", e4m3.dtype, e4m3.device)
PY
cat "$OUT/env.txt"

python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_rungs_gpu.py::test_gpu_matches_reference \
    tests/test_rungs_gpu.py::test_gpu_output_is_bitwise_deterministic \
    tests/test_decode.py::test_gpu_decode_step_replays_in_a_cuda_graph_with_new_lengths \
    tests/test_fp8_rungs.py::test_gpu_cute_fp8_end_to_end_takes_cache_seqlens_and_returns_the_lse \
    tests/test_cute_hopper.py::test_hopper_reads_strided_views \
    tests/test_cute_backward.py::test_gpu_gradients_pass_the_rule \
    tests/test_cute_backward.py::test_gpu_the_returned_lse_is_differentiable_too \
    -k "cute and (not matches_reference or sq77-sk1000-d128-bf16) and (not pass_the_rule or bottom_right_ragged_d128)" \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

python -m common.measure.api_overhead --out "$OUT/api-overhead" --shape decode --shape small \
    --only cute/decode --only cute/hopper --only triton/decode --only gluon/decode --only sdpa/flash \
    2>&1 | tee "$OUT/api-overhead.log" | tail -12
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
