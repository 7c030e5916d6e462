# One device call (stops 31-32): GPU tests first (parallel builds, pytest-xdist), then `stitchcuda bench` on the
# problems of PATTERN (default "$LEVEL/*.py") with what is left of the call. Environment: TESTS (pytest paths,
# "" = none), TEST_S, LEVEL, PATTERN, POLICY,
# JOBS, CALL_S (the whole call's budget), XDIST (workers), KB (the problems folder, default .kb).
set -u
T0=$(date +%s)
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../${KB:-.kb} .kb && . benchmarks/device_env.sh
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; free -g | head -2
( while true; do echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader) $(free -g | awk '/Mem/{print $3}')G"; sleep 5; done ) > $OUT/mem.log 2>&1 &
SAMPLER=$!
if [ -n "${TESTS:-}" ]; then
  STITCH_KERNELBENCH=$PWD/.kb timeout ${TEST_S:-300} python3 -m pytest -q -m gpu $TESTS -n ${XDIST:-8} \
    -p no:cacheprovider -rA --junitxml=$OUT/junit.xml 2>&1 | tail -150 > $OUT/pytest.log
  echo "pytest rc ${PIPESTATUS[0]}"; tail -3 $OUT/pytest.log
fi
if [ -n "${LEVEL:-}" ]; then
  LEFT=$(( ${CALL_S:-560} - ($(date +%s) - T0) - 25 ))
  mkdir -p .device/bench
  if [ -f .kb/resume_${LEVEL}.tgz ]; then tar xzf .kb/resume_${LEVEL}.tgz -C .device; fi
  echo "bench $LEVEL for ${LEFT}s"; date +%s > $OUT/bench_start
  STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home timeout $LEFT python3 -m stitchcuda.cli bench .kb \
    --pattern "${PATTERN:-$LEVEL/*.py}" --device cuda --rounds 0 --policy ${POLICY:-strict} --jobs ${JOBS:-4} \
    --out $PWD/.device/bench/$LEVEL > $OUT/bench.log 2>&1
  echo "bench rc $?"; date +%s > $OUT/bench_end
  tail -5 $OUT/bench.log
  tar czf $OUT/bench.tgz -C .device bench
fi
kill $SAMPLER
