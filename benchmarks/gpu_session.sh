#!/usr/bin/env bash
# Calls on the GPU machine: build hintbackend there (its Python is 3.12, so nothing built here can be
# carried), run the test corpus on CUDA, the demo, and the benchmarks. Logs go to $OUT.
#   run: bash benchmarks/gpu_session.sh [all|tests|bench|dist|fused|loss|dfs|lab|none]  (default all; each mode builds first,
#        reusing the build folder a warm machine kept; none only builds; dist needs 2 GPUs: the
#        DDP/FSDP2 check against eager and the step-time/peak table, DIST_ARGS adds to the table's flags;
#        tests: TESTS_PYTEST_ARGS adds pytest flags (e.g. -n 4);
#        fused: the generated CUDA FlexAttention kernels' tests (FUSED_K: a pytest -k filter) and, with
#        FUSED_BENCH set, benchmarks/flex.py --fused $FUSED_BENCH; FUSED_PYTEST_ARGS adds pytest flags, e.g.
#        -n 8); loss: the cross-entropy tests on CUDA, then benchmarks/memory_models.py --diagnose (HF
#        Llama, GPT-2, BERT: peaks and step times, LOSS_ARGS adds flags); dfs: the slicing tests and the demo with --dfs on CUDA, then benchmarks/slicing.py
#        --region flex-learned (DFS of a learned relative bias, DFS_ARGS adds flags); lab: no package build, only
#        benchmarks/flex_kernel_lab.cu for head dims $LAB_DIMS (default 128 64) with $LAB_ARGS (LAB_SM80=1:
#        also the mma.sync kernels on a Hopper GPU), then each template copy in $LAB_TEMPLATES (paths from the
#        repository root) at head dims $LAB_TEMPLATE_DIMS (default 128), each score_mod/joint file in
#        $LAB_MODS (with $LAB_DEFS; see the lab's HB_LAB_MODS), and with LAB_NCU set the backward under
#        Nsight Compute; LAB_FLAGS adds nvcc flags to every build, e.g. -DHB_FWD_PP=0)
set -uo pipefail
MODE="${1:-all}"
OUT="${OUT:-/tmp/hb-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
PY=python3
# The GPU machine's Python lacks the nvidia-cudnn-frontend wheel: carry its headers in .cfe/include
# (an ignored folder: mkdir -p .cfe && unzip the wheel's include/ there; name .cfe in the run's carry).
[ -f .cfe/include/cudnn_frontend.h ] && export HB_CUDNN_FRONTEND_INCLUDE=$PWD/.cfe/include
# Nor the nvidia-cutlass wheel (CUTLASS/CuTe headers for the generated CUDA kernels): carry it in .whl/
# (an ignored folder; name .whl in the run's carry) and unpack its headers.
for w in .whl/nvidia_cutlass-*.whl; do
  [ -f "$w" ] || continue
  $PY -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(n, '/tmp/cutlass') for n in z.namelist() if '/source/include/' in n]" "$w"
  export HINTBACKEND_CUTLASS_INCLUDE=/tmp/cutlass/cutlass_library/source/include
done
# The image's default CMake compiler is /opt/gcc/bin/g++, whose libstdc++ differs from the system one
# the process loads at run time: a module built with it segfaults in std::ostream (seen 2026-11-21).
# Build with the system compiler, the one that matches /lib/x86_64-linux-gnu/libstdc++.so.6.
[ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$MODE" = lab ]; then
  # As codegen/HostCompiler.cpp builds the generated unit: sm_90a with the wgmma kernels on a Hopper GPU.
  CC=$($PY -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
  ARCH="-gencode arch=compute_$CC,code=sm_$CC"
  [ "$CC" = 90 ] && ARCH="-gencode arch=compute_90a,code=sm_90a -DHB_SM90=1"
  LAB0="nvcc -O3 -std=c++17 -prec-div=false -I$HINTBACKEND_CUTLASS_INCLUDE -I. ${LAB_FLAGS:-} benchmarks/flex_kernel_lab.cu"
  LAB="$LAB0 $ARCH"
  for d in ${LAB_DIMS:-128 64}; do
    $LAB -DHB_D=$d -o /tmp/lab$d && /tmp/lab$d ${LAB_ARGS:-}
    # LAB_SM80=1: the mma.sync kernels too, for comparison
    [ -n "${LAB_SM80:-}" ] && $LAB0 -gencode arch=compute_$CC,code=sm_$CC -DHB_D=$d -o /tmp/lab${d}_80 && echo "(sm_80 kernels)" && /tmp/lab${d}_80 ${LAB_ARGS:-}
  done
  for t in ${LAB_TEMPLATES:-}; do
    for d in ${LAB_TEMPLATE_DIMS:-128}; do
      echo "== $t"
      $LAB -DHB_D=$d -DHB_LAB_TEMPLATE="\"../$t\"" -o /tmp/lab_t && /tmp/lab_t ${LAB_ARGS:-}
    done
  done
  for m in ${LAB_MODS:-}; do
    echo "== $m"
    $LAB -DHB_D=128 ${LAB_DEFS:-} -DHB_LAB_MODS="\"../$m\"" -o /tmp/lab_m && /tmp/lab_m ${LAB_ARGS:-}
  done
  if [ -n "${LAB_NCU:-}" ]; then
    ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
      -k regex:'flex_bwd$' -c 1 /tmp/lab128 ${LAB_ARGS:-} > "$OUT/ncu_bwd.txt" 2>&1
    grep -v "^==PROF==" "$OUT/ncu_bwd.txt" | grep -E "Throughput|Duration|Stall|Warp Cycles|Issued|Eligible|Achieved|L2|Shared|Bank|Registers|Theoretical" | head -60
  fi
  exit 0
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
t0=$(date +%s)
# A configure cached with another compiler would keep it: start over then.
for c in build/cp3*/CMakeCache.txt; do
  [ -f "$c" ] && ! grep -q "CMAKE_CXX_COMPILER:.*=/usr/bin/g++" "$c" && rm -rf "$(dirname "$c")"
done
$PY -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5 || exit 1
echo "build+install: $(( $(date +%s) - t0 )) s"
$PY -c "import torch, hintbackend; print('hintbackend._C WITH_CUDA =', hintbackend._core().WITH_CUDA)"
cd /tmp  # import the installed package, not the source tree
SRC=$OLDPWD
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  echo "== pytest on CUDA"
  HINTBACKEND_TEST_DEVICE=cuda timeout 330 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider ${TESTS_PYTEST_ARGS:-} \
    "$SRC/tests/python" \
    > "$OUT/pytest_cuda.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_cuda.log" | tail -25
  echo "== demo on CUDA"
  $PY -m hintbackend.demo --device cuda --steps 5 --dump-dir /tmp/hb-dumps 2>&1 | tee "$OUT/demo_cuda.log" | tail -12
  echo "== overhead benchmark"
  $PY "$SRC/benchmarks/overhead.py" --device cuda --iters 2000 > "$OUT/overhead_cuda.log" 2>&1; tail -4 "$OUT/overhead_cuda.log"
  $PY "$SRC/benchmarks/overhead.py" --device cpu --iters 2000 > "$OUT/overhead_cpu.log" 2>&1; tail -4 "$OUT/overhead_cpu.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  for b in slicing memory fusion flex; do
    [ -f "$SRC/benchmarks/$b.py" ] || continue
    echo "== $b benchmark"
    timeout 300 $PY "$SRC/benchmarks/$b.py" > "$OUT/$b.log" 2>&1; tail -24 "$OUT/$b.log"
  done
  echo "== slicing benchmark, flex_attention region"
  timeout 240 $PY "$SRC/benchmarks/slicing.py" --region flex > "$OUT/slicing_flex.log" 2>&1; tail -16 "$OUT/slicing_flex.log"
fi
if [ "$MODE" = loss ]; then
  echo "== the cross-entropy ops and folds on CUDA (test_cross_entropy.py), then the HF models' peaks"
  HINTBACKEND_TEST_DEVICE=cuda timeout 300 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider \
    "$SRC/tests/python/test_cross_entropy.py" > "$OUT/pytest_loss.log" 2>&1
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/pytest_loss.log" | head -30
  timeout 420 $PY "$SRC/benchmarks/memory_models.py" --diagnose --steps 10 ${LOSS_ARGS:-} > "$OUT/memory_models.log" 2>&1
  tail -12 "$OUT/memory_models.log"
fi
if [ "$MODE" = dfs ]; then
  echo "== slicing tests and the demo with a dfs region, on CUDA"
  HINTBACKEND_TEST_DEVICE=cuda timeout 300 $PY -m pytest -q -rfE --tb=short -p no:cacheprovider \
    "$SRC/tests/python/test_slicing.py" "$SRC/tests/python/test_demo.py" > "$OUT/pytest_dfs.log" 2>&1
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/pytest_dfs.log" | head -30
  echo "== benchmarks/slicing.py --region flex-learned ${DFS_ARGS:-}"
  timeout 300 $PY "$SRC/benchmarks/slicing.py" --region flex-learned ${DFS_ARGS:-} > "$OUT/slicing_learned.log" 2>&1
  tail -16 "$OUT/slicing_learned.log"
fi
if [ "$MODE" = fused ]; then
  echo "== generated CUDA FlexAttention kernels: tests ${FUSED_K:+(-k $FUSED_K)}"
  HINTBACKEND_TEST_DEVICE=cuda timeout ${FUSED_TIMEOUT:-300} $PY -m pytest -q -rfE --tb=short -p no:cacheprovider \
    ${FUSED_PYTEST_ARGS:-} ${FUSED_K:+-k "$FUSED_K"} "$SRC/tests/python/test_flex_fused_cuda.py" > "$OUT/pytest_fused.log" 2>&1
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/pytest_fused.log" | head -40
  if [ -n "${FUSED_BENCH:-}" ]; then
    echo "== benchmarks/flex.py --fused $FUSED_BENCH"
    timeout ${FUSED_BENCH_TIMEOUT:-240} $PY "$SRC/benchmarks/flex.py" --fused $FUSED_BENCH > "$OUT/flex_fused.log" 2>&1
    tail -${FUSED_TAIL:-20} "$OUT/flex_fused.log"
  fi
fi
if [ "$MODE" = dist ]; then
  NGPU=$(nvidia-smi -L | wc -l)
  TR="$PY -m torch.distributed.run --standalone --nproc-per-node $NGPU -m hintbackend.distributed_demo --device cuda"
  echo "== DDP and FSDP2 against eager on $NGPU GPUs (bf16 attention on cuDNN, dfs region)"
  timeout 240 $TR --attn-dtype bfloat16 --dfs --steps 10 > "$OUT/dist_check.log" 2>&1
  grep -E "^\[(ddp|fsdp2)\]|Error" "$OUT/dist_check.log" | head -60
  echo "== step time and per-rank peak: ${DIST_ARGS:-}"
  timeout 420 $TR --bench --layers 4 --dim 512 --heads 8 --seq 1024 --batch 4 --attn-dtype bfloat16 ${DIST_ARGS:-} \
    > "$OUT/dist_bench.log" 2>&1
  grep -E "^\[(ddp|fsdp2)\]|Error" "$OUT/dist_bench.log" | head -60
fi
