set -u
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
echo "commit $(cat COMMIT)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; free -g | head -2
( while true; do echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader) $(free -g | awk '/Mem/{print $3}')G"; sleep 5; done ) > $OUT/mem.log 2>&1 &
SAMPLER=$!
STITCH_TEST_BUILD_DIR=$PWD/.device/test-builds timeout ${PYTEST_S:-150} python3 -m pytest -q -m gpu tests/gpu/test_verifier_runtime_gpu.py -k "${PYTEST_K:-honest_cuda or wait_for_the_gpu}" -p no:cacheprovider -o faulthandler_timeout=100 -v 2>&1 | tail -60 > $OUT/pytest.log
mkdir -p .device/l2
if [ -f .kb/l2_resume.tgz ]; then tar xzf .kb/l2_resume.tgz -C .device; fi
date +%s > $OUT/bench_start
STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home timeout ${BENCH_S:-420} python3 -m stitchcuda.cli bench .kb --pattern 'level2/*.py' --device cuda --rounds 0 --policy library --jobs ${JOBS:-5} --out $PWD/.device/l2 > $OUT/bench.log 2>&1
echo "bench rc $?"; date +%s > $OUT/bench_end
kill $SAMPLER
tail -5 $OUT/bench.log
ls .device/l2/problems/level2 | wc -l
tar czf $OUT/l2.tgz -C .device l2
