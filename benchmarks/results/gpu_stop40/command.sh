# Stop 40, one device call: GPU tests (TESTS, -k K), then benchmarks/variant_speed.py over VS_PROBLEMS with
# VS_VARIANTS (VS_S seconds; VS_ARGS passed on, since stop 41), then `stitchcuda bench` over each of PATTERNS
# in turn (the Verifier's verdicts, strict policy, one round) with what is left of CALL_S.
# Run from the repository root of the device copy, with .clean/ a `git archive` of the commit, .whl/ the
# wheels of benchmarks/device_env.sh and .kb/ the public KernelBench problems: carry [".whl", ".kb", ".clean"]
# (and ".prev" to go on from an earlier call's bench.tgz).
set -u
T0=$(date +%s)
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_S:-200} python3 -m pytest -q -m gpu $TESTS ${K:+-k "$K"} -n ${XDIST:-1} -p no:cacheprovider -rA \
    2>&1 | tail -80 > $OUT/pytest.log
  echo "pytest rc ${PIPESTATUS[0]}"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error|error:" $OUT/pytest.log | tail -30
fi
if [ -n "${VS_PROBLEMS:-}" ]; then
  timeout ${VS_S:-200} python3 benchmarks/variant_speed.py $VS_PROBLEMS --variants $VS_VARIANTS --policy strict \
    --rounds ${VS_ROUNDS:-10} ${VS_ARGS:-} --out $OUT/variant_speed.json > $OUT/variant_speed.log 2>&1
  echo "variant_speed rc $?"; tail -40 $OUT/variant_speed.log
fi
mkdir -p .device/bench
[ -f ../.prev/bench.tgz ] && tar xzf ../.prev/bench.tgz -C .device && echo "resumed from .prev/bench.tgz"
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
