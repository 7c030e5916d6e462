set -u
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
export STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home
timeout 140 python3 -m stitchcuda.cli bench .kb --pattern 'l1last/*.py' --device cuda --rounds 0 --policy library --jobs 2 --out $OUT/bench_l1c > $OUT/bench_l1c.log 2>&1; echo "bench rc $?" >> $OUT/bench_l1c.log
grep -E "verified|rejected|failed|interrupted" $OUT/bench_l1c.log | head
timeout 90 python3 -m pytest -m gpu tests/gpu/test_synth_reduce_gpu.py -p no:cacheprovider -q > $OUT/reduce_gpu.log 2>&1; echo "reduce tests rc $?" >> $OUT/reduce_gpu.log
tail -6 $OUT/reduce_gpu.log
cd $OUT && tar czf logs_c.tgz bench_l1c 2>/dev/null; rm -rf bench_l1c
