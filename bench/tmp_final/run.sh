set -uo pipefail
source bench/_gpu_run.sh final runs/final
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/times.txt"
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> "$OUT/times.txt"
begun=$SECONDS
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests/test_decode.py tests/test_paged_kv.py \
  tests/test_triton_decode_build_fit.py tests/test_triton_decode_one_wave.py tests/test_decode_target.py \
  tests/test_decode_packed.py tests/test_decode_ragged.py tests/test_decode_wide.py tests/test_decode_d256.py \
  tests/test_decode_d256_rows.py tests/test_decode_mtile_major.py tests/test_decode_merge_group.py \
  tests/test_decode_shallow_ring.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: rc $? $((SECONDS - begun)) s" >> "$OUT/times.txt"
tail -3 "$OUT/gpu-tests.log"; cat "$OUT/times.txt"
