#!/usr/bin/env bash
# Builds and runs the FlexAttention runtime test without CMake: one g++ command (the build machine is
# small and shared), against the venv's libtorch. Usage: tests/cpp/runtime/build_flex_test.sh [gtest args]
# Env: HB_VENV (default /root/.cache/hintbackend/venv), OUT_DIR (default build/flex_test).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
VENV="${HB_VENV:-/root/.cache/hintbackend/venv}"
TORCH="$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)"
OUT_DIR="${OUT_DIR:-$ROOT/build/flex_test}"
mkdir -p "$OUT_DIR"

g++ -std=c++17 -O1 -Wall -Wextra -D_GLIBCXX_USE_CXX11_ABI=1 \
  -I"$ROOT" -isystem "$TORCH/include" -isystem "$TORCH/include/torch/csrc/api/include" \
  "$ROOT/backend/runtime/FlexAttention.cpp" "$ROOT/tests/cpp/runtime/flex_attention_test.cpp" \
  -o "$OUT_DIR/flex_attention_test" \
  -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch -ltorch_cpu -lc10 -lgtest -lgtest_main -pthread

"$OUT_DIR/flex_attention_test" "$@"
