#!/usr/bin/env bash
# GPU check of the CuTe rungs' TVM-FFI launch path (issues #39/#38; about 3 minutes on an H200):
#   1. the launch path's environment: torch's DLPack exchange API, TVM-FFI, e4m3 tensors through DLPack;
#   2. every CuTe rung's launch against float64: naive, online, tiled, pipelined and hopper with GQA,
#      bottom-right causal, cache_seqlens and the LSE; decode split and unsplit, and replayed in a CUDA
#      graph with and without pages; FP8 with cache_seqlens and the LSE; hopper on strided views; the
#      naive, tiled and hopper backward (with a differentiated LSE);
#   3. the host time per call of attention() (binding + launch) for cute/decode and cute/hopper against
#      triton/decode, gluon/decode and SDPA at an eager decode step (B=1, 32/8 heads, 8k) and a small prefill.
# Usage: OUT=/some/folder bash bench/cute_tvm_ffi_check.sh   (writes env.txt, gpu-tests*.log, api-overhead/)
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
    tests/test_cute_naive_online.py::test_gqa_alignments_cache_seqlens_and_lse \
    tests/test_cute_tiled_pipelined.py::test_gqa_alignments_cache_seqlens_and_lse \
    tests/test_cute_hopper.py::test_hopper_gqa_alignments_cache_seqlens_and_lse \
    -k "128 and gqa4 and causal_bottom_right-cache_seqlens" 2>&1 | tee "$OUT/gpu-tests-forward.log" | tail -8
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

python -m pytest -q -m gpu -p no:cacheprovider \
    "tests/test_decode.py::test_gpu_decode_against_fp64[cute/decode-sq4-hkv8-sk32768-d128-bf16-bottom_right-splits3]" \
    "tests/test_decode.py::test_gpu_decode_against_fp64[cute/decode-sq2-hkv8-sk5000-d64-bf16-full-splits1-padded-nolse]" \
    "tests/test_decode.py::test_gpu_decode_step_replays_in_a_cuda_graph_with_new_lengths[cute/decode-contiguous]" \
    "tests/test_decode.py::test_gpu_decode_step_replays_in_a_cuda_graph_with_new_lengths[cute/decode-paged]" \
    tests/test_fp8_rungs.py::test_gpu_cute_fp8_end_to_end_takes_cache_seqlens_and_returns_the_lse \
    tests/test_cute_hopper.py::test_hopper_reads_strided_views \
    "tests/test_cute_backward.py::test_gpu_gradients_pass_the_rule[cute/naive-gqa_causal_bottom_right_ragged_d128]" \
    "tests/test_cute_backward.py::test_gpu_gradients_pass_the_rule[cute/tiled-gqa_causal_bottom_right_ragged_d128]" \
    "tests/test_cute_backward.py::test_gpu_gradients_pass_the_rule[cute/hopper-gqa_causal_bottom_right_ragged_d128]" \
    "tests/test_cute_backward.py::test_gpu_the_returned_lse_is_differentiable_too[cute/hopper]" \
    2>&1 | tee "$OUT/gpu-tests-decode-fp8-backward.log" | tail -8
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

python -m common.measure.api_overhead --out "$OUT/api-overhead" --shape decode --shape small \
    --only cute/decode --only cute/hopper --only triton/decode --only gluon/decode --only sdpa/flash \
    2>&1 | tee "$OUT/api-overhead.log" | tail -12
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
