set -u
cd .clean && ln -s ../.whl .whl && ln -s ../.kb .kb && . benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
export STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home
timeout 80 python3 -m pytest -m gpu tests/gpu/test_triton_gpu.py -s -p no:cacheprovider -q > $OUT/triton.log 2>&1; echo "triton rc $?" >> $OUT/triton.log
tail -4 $OUT/triton.log
( while true; do date +%T; free -g | sed -n 2p; nvidia-smi --query-gpu=memory.used --format=csv,noheader; sleep 3; done ) > $OUT/mem.log 2>&1 &
MEM=$!
timeout 200 python3 -m stitchcuda.cli bench .kb --pattern 'l1rest/*.py' --device cuda --rounds 0 --policy library --jobs 4 --out $OUT/bench_l1 > $OUT/bench_l1.log 2>&1; echo "bench rc $?" >> $OUT/bench_l1.log
kill $MEM
tail -12 $OUT/bench_l1.log
timeout 70 python3 benchmarks/reduce_bandwidth.py --out $OUT/reduce.json > $OUT/reduce.log 2>&1; echo "reduce rc $?" >> $OUT/reduce.log
tail -30 $OUT/reduce.log
cd $OUT && tar czf logs.tgz bench_l1 2>/dev/null; rm -rf bench_l1
