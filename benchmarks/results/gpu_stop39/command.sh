# Stop 39, one device call: GPU tests (TESTS), then `stitchcuda bench` over each of PATTERNS in turn (the
# Verifier's verdicts, strict policy, one round) with what is left of CALL_S.
# Run from the repository root of the device copy, with .clean/ a `git archive` of the commit, .whl/ the
# wheels of benchmarks/device_env.sh and .kb/ the public KernelBench problems: carry [".whl", ".kb", ".clean"] (and ".prev" to go on from an earlier call).
# Environment: TESTS (pytest paths), K (their -k), TEST_S, XDIST, REDUCE_S (0: no bandwidth run), PATTERNS (space-separated globs under .kb), CALL_S, JOBS.
set -u
T0=$(date +%s)
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_S:-200} python3 -m pytest -q -m gpu $TESTS ${K:+-k "$K"} -n ${XDIST:-4} -p no:cacheprovider -rA \
    2>&1 | tail -80 > $OUT/pytest.log
  echo "pytest rc ${PIPESTATUS[0]}"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/pytest.log | tail -40
fi
if [ "${REDUCE_S:-0}" != 0 ]; then
  timeout $REDUCE_S python3 benchmarks/reduce_bandwidth.py --out $OUT/reduce.json > $OUT/reduce.log 2>&1
  echo "reduce rc $?"; tail -40 $OUT/reduce.log
fi
mkdir -p .device/bench
# A call that goes on from an earlier one: its bench folders, carried as .prev/bench.tgz.
[ -f ../.prev/bench.tgz ] && tar xzf ../.prev/bench.tgz -C .device && echo "resumed from .prev/bench.tgz"
# A snapshot of the bench folders every 45 s: a call cut short by the device time still brings results back.
( while sleep 45; do tar czf $OUT/bench.tmp -C .device bench 2>/dev/null && mv $OUT/bench.tmp $OUT/bench.tgz; done ) &
SNAP=$!
i=0
for PATTERN in ${PATTERNS:-}; do
  i=$((i + 1))
  LEFT=$(( ${CALL_S:-560} - ($(date +%s) - T0) - 25 ))
  [ "$LEFT" -lt 60 ] && break
  echo "bench $PATTERN for ${LEFT}s"
  STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home timeout $LEFT python3 -m stitchcuda.cli bench .kb \
    --pattern "$PATTERN" --device cuda --rounds 0 --policy strict --jobs ${JOBS:-4} \
    --out $PWD/.device/bench/b$i > $OUT/bench$i.log 2>&1
  echo "bench rc $?"; tail -4 $OUT/bench$i.log
done
kill $SNAP 2>/dev/null; wait $SNAP 2>/dev/null
tar czf $OUT/bench.tgz -C .device bench
