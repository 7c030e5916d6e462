# Stop 36, one device call: the GPU tests of the CUTLASS GEMMs (SM80 and the Hopper wgmma GEMM over split
# operands, gemm_kernel=cutlass_sm90), then benchmarks/variant_speed.py on public KernelBench problems (the
# variants side by side with eager and torch.compile). Run from the repository root of the device copy, with
# .clean/ a `git archive` of the commit, .whl/ the wheels of benchmarks/device_env.sh (nvidia-cutlass
# included) and .kb2/var/ the problems: carry [".whl", ".kb2", ".clean"].
set -u
cd .clean && ln -sfn ../.whl .whl && . benchmarks/device_env.sh >/dev/null
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
STITCH_KERNELBENCH=$PWD/../.kb2 timeout ${TEST_S:-240} python3 -m pytest -q -m gpu \
  "tests/gpu/test_synth_gpu.py::test_cutlass_gemms_match" \
  "tests/gpu/test_synth_gpu.py::test_cutlass_gemms_of_every_layout_match" \
  "tests/gpu/test_synth_gpu.py::test_cutlass_split_k_gemm_matches" \
  "tests/gpu/test_synth_gpu.py::test_sm90_gemm_runs_wgmma_on_hopper" \
  -n ${XDIST:-13} -p no:cacheprovider -rA 2>&1 | tail -80 > $OUT/pytest.log
echo "pytest rc ${PIPESTATUS[0]}"; tail -4 $OUT/pytest.log
timeout ${VARIANT_S:-200} python3 benchmarks/variant_speed.py ${GEMMS:-../.kb2/var/12_*.py ../.kb2/var/76_*.py ../.kb2/var/1_*.py ../.kb2/var/6_*.py} \
  --variants ${VARIANTS:-default gemm_kernel=cutlass_sm90} --rounds 10 --out $OUT/variants_gemm.json 2>&1 | tail -24
timeout ${CONV_S:-130} python3 benchmarks/variant_speed.py ${CONVS:-../.kb2/var/4_*.py ../.kb2/var/5_*.py} \
  --variants default epilogue=fused --rounds 10 --out $OUT/variants_conv.json 2>&1 | tail -12
