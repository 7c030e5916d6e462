# Stop 35, one device call: the GPU tests of the own 3xTF32 convolution/GEMM kernels, their fused epilogues
# and the CUTLASS GEMMs (pytest-xdist), then benchmarks/variant_speed.py on four public level-2 problems
# (variants side by side with eager and torch.compile). Run from the repository root of the device copy,
# with .clean/ a `git archive` of the commit, .whl/ the wheels of benchmarks/device_env.sh (nvidia-cutlass
# included) and .kb2/var/ the problems: carry [".whl", ".kb2", ".clean"].
set -u
cd .clean && ln -sfn ../.whl .whl && . benchmarks/device_env.sh >/dev/null
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "from stitchcuda.shared import cutlass; print('cutlass headers', cutlass.include_dir())"
STITCH_KERNELBENCH=$PWD/../.kb2 timeout ${TEST_S:-240} python3 -m pytest -q -m gpu tests/gpu/test_synth_conv_gpu.py \
  "tests/gpu/test_synth_gpu.py::test_custom_gemm_and_conv_kernels_match" \
  "tests/gpu/test_synth_gpu.py::test_cutlass_gemms_match" \
  "tests/gpu/test_synth_gpu.py::test_cutlass_gemms_of_every_layout_match" \
  "tests/gpu/test_synth_gpu.py::test_cutlass_split_k_gemm_matches" \
  -n ${XDIST:-10} -p no:cacheprovider -rA 2>&1 | tail -80 > $OUT/pytest.log
echo "pytest rc ${PIPESTATUS[0]}"; tail -4 $OUT/pytest.log
timeout ${VARIANT_S:-300} python3 benchmarks/variant_speed.py ${PROBLEMS:-../.kb2/var/12_*.py ../.kb2/var/76_*.py ../.kb2/var/4_*.py ../.kb2/var/5_*.py} \
  --variants ${VARIANTS:-default gemm_kernel=cutlass mma=simt epilogue=kernel} --rounds 10 --out $OUT/variants.json 2>&1 | tail -20
