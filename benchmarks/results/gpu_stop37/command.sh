# Stop 37, one device call: the Hopper GEMM's GPU tests, benchmarks/reduce_bandwidth.py (the memory-bound
# kernels against the device's copy bandwidth), then `stitchcuda bench` on LEVEL's problems with what is left.
# Run from the repository root of the device copy, with .clean/ a `git archive` of the commit, .whl/ the
# wheels of benchmarks/device_env.sh and .kb/LEVEL/ the problems: carry [".whl", ".kb", ".clean"].
# Environment: LEVEL, CALL_S (the call's budget), REDUCE_S (0 skips the bandwidth run), JOBS.
set -u
T0=$(date +%s)
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout ${TEST_S:-150} python3 -m pytest -q -m gpu \
  "tests/gpu/test_synth_gpu.py::test_sm90_gemm_runs_wgmma_on_hopper" \
  "tests/gpu/test_synth_gpu.py::test_sm90_gemm_of_operands_past_the_split_limit_runs_in_panels" \
  -n 2 -p no:cacheprovider -rA 2>&1 | tail -60 > $OUT/pytest.log
echo "pytest rc ${PIPESTATUS[0]}"; tail -3 $OUT/pytest.log
if [ "${REDUCE_S:-200}" != 0 ]; then
  timeout ${REDUCE_S:-200} python3 benchmarks/reduce_bandwidth.py --out $OUT/reduce.json > $OUT/reduce.log 2>&1
  echo "reduce rc $?"; tail -30 $OUT/reduce.log
fi
if [ -n "${LEVEL:-}" ]; then
  LEFT=$(( ${CALL_S:-560} - ($(date +%s) - T0) - 25 ))
  mkdir -p .device/bench
  echo "bench $LEVEL for ${LEFT}s"
  STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home timeout $LEFT python3 -m stitchcuda.cli bench .kb \
    --pattern "$LEVEL/*.py" --device cuda --rounds 0 --policy ${POLICY:-strict} --jobs ${JOBS:-4} \
    --out $PWD/.device/bench/$LEVEL > $OUT/bench.log 2>&1
  echo "bench rc $?"; tail -5 $OUT/bench.log
  tar czf $OUT/bench.tgz -C .device bench
fi
