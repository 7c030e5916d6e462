set -u
cd .clean && ln -s ../.whl .whl && ln -s ../.kb .kb && . benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
export STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home
timeout 110 python3 -m pytest -m gpu tests/gpu/test_triton_gpu.py -x -s -p no:cacheprovider -q > $OUT/triton.log 2>&1; echo "triton rc $?" >> $OUT/triton.log
tail -4 $OUT/triton.log
( while true; do date +%T; free -g | sed -n 2p; nvidia-smi --query-gpu=memory.used --format=csv,noheader; sleep 3; done ) > $OUT/mem.log 2>&1 &
MEM=$!
timeout 300 python3 -m stitchcuda.cli bench .kb --pattern 'level1/*.py' --device cuda --rounds 0 --policy library --jobs 4 --out $OUT/bench_l1 > $OUT/bench_l1.log 2>&1; echo "bench rc $?" >> $OUT/bench_l1.log
tail -16 $OUT/bench_l1.log
echo == l2 >> $OUT/mem.log
timeout 150 python3 -m stitchcuda.cli bench .kb --pattern 'l2pair/*.py' --device cuda --rounds 0 --policy library --jobs 2 --out $OUT/bench_l2 > $OUT/bench_l2.log 2>&1; echo "bench rc $?" >> $OUT/bench_l2.log
kill $MEM
tail -8 $OUT/bench_l2.log
cd $OUT && tar czf logs.tgz bench_l1 bench_l2 2>/dev/null; rm -rf bench_l1 bench_l2
