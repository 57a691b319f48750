#!/usr/bin/env bash
# FlashInfer (flashinfer-python) for the GPU machine: the flashinfer/decode baseline row of
# `compare.py --decode` (common/measure/flashinfer.py). Run from the project root:
#     PYTHON=/path/to/python-with-torch bash bench/prepare_flashinfer.sh        (about 15 minutes the first time)
#
# What the machine lacks: its image has nvcc 13.0, ninja, einops, tabulate, requests and nvidia-ml-py,
# but not flashinfer-python nor apache-tvm-ffi (the FFI its kernel modules are built against). The
# flashinfer wheel is 62 MB (420 MB unpacked, mostly kernels of other GPUs and other operators), over
# what one device call may carry beside the tree, so this script keeps what `import flashinfer` and its
# decode JIT read (every .py file, the headers in data/include, the vendored CCCL and spdlog, the
# top-level data/csrc sources), adds apache-tvm-ffi for CPython 3.12, and builds ahead of time (AOT,
# here, for sm_90a with this machine's nvcc) the two kernel modules of the decode sweep: bf16 at D=128
# through FlashInfer's CUDA-core decode and through its tensor-core (FA2 prefill) path. FlashInfer
# loads them from data/aot/ and JIT-compiles anything else on the device (or these too, if a module
# built here fails to load there). Packed with xz (about 15 MB) and split into parts of at most 50 MB:
#   .gpu/flashinfer/flashinfer.tar.xz.part-NN  carried with the call, or stashed into /tmp/carry first by
#   .gpu/flashinfer/stash.sh                   one call per part when the call also carries the CuTe DSL
#   .gpu/flashinfer/activate.sh                unpacks into /tmp/site_flashinfer, sets PYTHONPATH, the JIT
#                                              cache (/tmp/flashinfer-jit) and the driver's libcuda for linking
# Without a Python that has torch (PYTHON), or with NO_AOT=1, the AOT step is left out: the device then
# JIT-compiles every module on first use (minutes each; bench/flashinfer_probe.sh times one).
set -euo pipefail
VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}
PYTHON=${PYTHON:-python3}
PART_BYTES=50M
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/gpu-carry/flashinfer-$VERSION
OUT=.gpu/flashinfer
mkdir -p "$OUT" "$CACHE"
download() {  # download DIR ARGS...: wheels for the GPU machine's CPython 3.12 on x86-64
  local dir=$1; shift
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$@" 2>&1 | grep -v '^WARNING' || true
}

# 1. The wheels, unpacked and trimmed to what the decode path reads.
if [[ ! -d $CACHE/tree/flashinfer ]]; then
  echo "downloading flashinfer-python $VERSION and apache-tvm-ffi $TVM_FFI_VERSION (CPython 3.12) ..."
  rm -rf "$CACHE/whl" "$CACHE/full" "$CACHE/tree.part"; mkdir -p "$CACHE/whl" "$CACHE/full" "$CACHE/tree.part"
  download "$CACHE/whl" "flashinfer-python==$VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"
  for w in "$CACHE"/whl/*.whl; do (cd "$CACHE/full" && "$PYTHON" -m zipfile -e "$w" .); done
  (cd "$CACHE/full" && {
    find flashinfer -type f -name '*.py'
    find flashinfer/data/include flashinfer/data/cccl flashinfer/data/spdlog -type f
    find flashinfer/data/csrc -maxdepth 1 -type f
    find flashinfer_python-*.dist-info -type f ! -name RECORD
    find tvm_ffi apache_tvm_ffi-*.dist-info -type f
  } | tar cf - -T - | tar xf - -C "$CACHE/tree.part")
  rm -rf "$CACHE/full" "$CACHE/tree"; mv "$CACHE/tree.part" "$CACHE/tree"
fi

# 2. AOT: the sweep's modules for sm_90a, built with this machine's nvcc into data/aot/<module>/.
cuda_home() {  # the toolkit folder FlashInfer's build reads: bin/nvcc, include/ and lib64/libcudart.so
  local dir
  for dir in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
    if [[ -x $dir/bin/nvcc && -e $dir/lib64/libcudart.so ]]; then echo "$dir"; return 0; fi
  done
  return 1
}
aot_build() {
  local site=$CACHE/build-site stub=$CACHE/libcuda-stub
  rm -rf "$site"; mkdir -p "$site" "$stub"
  # This interpreter's own tvm-ffi and the small packages flashinfer imports, for the build only.
  "$PYTHON" -m pip install -q --no-deps --target "$site" "apache-tvm-ffi==$TVM_FFI_VERSION" einops tabulate \
    nvidia-ml-py requests urllib3 idna certifi charset-normalizer 2>&1 | grep -v '^WARNING' || true
  # The modules link with -lcuda; a stub with the driver's soname stands in for it here.
  echo "" > "$stub/empty.c" && cc -shared -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/empty.c"
  PYTHONPATH="$site:$CACHE/tree" FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$CACHE/jit" \
    FLASHINFER_EXTRA_LDFLAGS="-L$stub" CUDA_HOME="$(cuda_home)" \
    "$PYTHON" - "$CACHE/tree/flashinfer/data/aot" <<'EOS'
import shutil, sys, time
from pathlib import Path

import torch
from flashinfer.jit.attention.modules import gen_batch_decode_module
from flashinfer.prefill import _gen_batch_prefill_primary_module

# FlashInfer's plan() asks for these (flashinfer/decode.py): the CUDA-core decode and, for groups of 4+
# query heads per KV head and Sq > 1, the FA2 tensor-core path; bf16, D=128, int32 indices.
args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 128, 128, 0, False, False)
for spec in (gen_batch_decode_module(*args), _gen_batch_prefill_primary_module("fa2", *args, False)):
    start = time.time()
    spec.build()
    target = Path(sys.argv[1]) / spec.name / f"{spec.name}.so"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, target)
    print(f"AOT {spec.name}: {target.stat().st_size / 1e6:.1f} MB in {time.time() - start:.0f} s")
EOS
}
if [[ ${NO_AOT:-0} == 1 ]]; then
  echo "NO_AOT=1: no modules built ahead of time; the device JIT-compiles them"
elif [[ -d $CACHE/tree/flashinfer/data/aot ]]; then
  echo "AOT modules already built: $(ls "$CACHE/tree/flashinfer/data/aot" | tr '\n' ' ')"
elif ! "$PYTHON" -c "import torch" 2>/dev/null || ! cuda_home >/dev/null; then
  echo "no AOT step: $PYTHON has no torch or there is no CUDA toolkit here (set PYTHON=...); the device JIT-compiles"
else
  echo "building the sweep's two modules for sm_90a (about 10 minutes on 2 cores) ..."
  aot_build
fi

# 3. Pack, split, and the device-side scripts.
if [[ ! -s $CACHE/flashinfer.tar.xz || $CACHE/tree -nt $CACHE/flashinfer.tar.xz ]]; then
  echo "packing with xz (a few minutes) ..."
  tar cf - -C "$CACHE/tree" . | xz -T2 -9 > "$CACHE/flashinfer.tar.xz.tmp"
  mv "$CACHE/flashinfer.tar.xz.tmp" "$CACHE/flashinfer.tar.xz"
fi
rm -f "$OUT"/flashinfer.tar.xz.part-*
split -b "$PART_BYTES" -d "$CACHE/flashinfer.tar.xz" "$OUT/flashinfer.tar.xz.part-"
PART_NAMES=$(cd "$OUT" && ls flashinfer.tar.xz.part-* | tr '\n' ' ')
PARTS=$(echo $PART_NAMES | wc -w)
cat > "$OUT/stash.sh" <<'EOS'
# one device call per part: keep the part this call carries in /tmp/carry until activate.sh joins them
mkdir -p /tmp/carry && cp .gpu/flashinfer/flashinfer.tar.xz.part-* /tmp/carry/ && ls -l /tmp/carry/flashinfer.tar.xz.part-*
EOS
cat > "$OUT/activate.sh" <<EOS
# sourced on the device from the project root: flashinfer $VERSION importable, JIT cache in /tmp.
# Each part is taken from .gpu/flashinfer/ when this call carries it, else from /tmp/carry (stash.sh).
if [[ ! -d /tmp/site_flashinfer/flashinfer ]]; then
  parts=()
  for name in $PART_NAMES; do
    for dir in .gpu/flashinfer /tmp/carry; do
      if [[ -s \$dir/\$name ]]; then parts+=("\$dir/\$name"); break; fi
    done
  done
  [[ \${#parts[@]} == $PARTS ]] || { echo "flashinfer: \${#parts[@]} of $PARTS parts found (carry them, or stash them again if the machine went cold)" >&2; return 1; }
  mkdir -p /tmp/site_flashinfer && cat "\${parts[@]}" | xz -d | tar x -C /tmp/site_flashinfer || return 1
fi
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}/tmp/site_flashinfer"
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-jit
# JIT modules link with -lcuda: the driver's libcuda.so.1 under that name, wherever the image keeps it.
libcuda=\$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print \$NF; exit}')
if [[ -n \$libcuda ]]; then
  mkdir -p /tmp/flashinfer-ld && ln -sf "\$libcuda" /tmp/flashinfer-ld/libcuda.so
  export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/flashinfer-ld"
fi
python3 -c "import flashinfer, pathlib; aot = list(pathlib.Path(flashinfer.__file__).parent.glob('data/aot/*/*.so')); print('flashinfer', flashinfer.__version__, 'ready;', len(aot), 'AOT modules')" 2>&1 | grep -v Warning
EOS
ls -l "$OUT"
echo "alone: carry [\".gpu/flashinfer\"] (all $PARTS part(s)), command: source .gpu/flashinfer/activate.sh && ..."
echo "beside the CuTe DSL (over 64 MiB together): first one stash call per part, back to back (the machine keeps /tmp only while warm),"
for part in $PART_NAMES; do
  echo "  carry [\".gpu/flashinfer/$part\", \".gpu/flashinfer/stash.sh\"], command: bash .gpu/flashinfer/stash.sh"
done
echo "  then carry [\".gpu/cutlass-dsl.tar.xz\", \".gpu/activate.sh\", \".gpu/fa4\", \".gpu/flashinfer/activate.sh\"], command:"
echo "  source .gpu/activate.sh && source .gpu/fa4/activate.sh && source .gpu/flashinfer/activate.sh && ..."
