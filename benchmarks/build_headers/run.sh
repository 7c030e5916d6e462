#!/usr/bin/env bash
# How long one translation unit takes to compile with each choice of torch headers (one TU per core, all at once).
#   bash benchmarks/build_headers/run.sh [OUTDIR]
# full_extension.cu: torch/extension.h through nvcc (what the synthesizer emitted up to stop 23); aten.cu: ATen/ATen.h;
# per_op.cu: ATen/core/Tensor.h + per-operator headers; no_torch.cu: cuda_runtime.h only;
# binding_*.cpp: a pybind module through g++, with torch/extension.h or the light headers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
ti=$(python3 -c 'import torch.utils.cpp_extension as c; print(" ".join("-isystem " + p for p in c.include_paths("cuda")))')
py=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
common="$ti -isystem $py -D_GLIBCXX_USE_CXX11_ABI=$abi -DTORCH_EXTENSION_NAME=x -DTORCH_API_INCLUDE_EXTENSION_H -std=c++17 -O3"
for f in full_extension aten per_op no_torch; do
  ( s=$EPOCHREALTIME; nvcc -c "$here/$f.cu" -o "$out/$f.o" $common --compiler-options -fPIC --expt-relaxed-constexpr \
      -gencode=arch=compute_90,code=sm_90 >"$out/$f.log" 2>&1 && echo "$f.cu $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $s}") s" \
      || echo "$f.cu FAILED" ) &
done
for f in binding_extension binding_light; do
  ( s=$EPOCHREALTIME; c++ -c "$here/$f.cpp" -o "$out/$f.o" $common -fPIC >"$out/$f.log" 2>&1 \
      && echo "$f.cpp $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $s}") s" || echo "$f.cpp FAILED" ) &
done
wait
