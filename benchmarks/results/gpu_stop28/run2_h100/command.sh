set -u
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
export STITCH_LOG_LEVEL=INFO STITCH_HOME=$PWD/.device/home_l2
( while true; do date +%T; free -g | sed -n 2p; nvidia-smi --query-gpu=memory.used --format=csv,noheader; sleep 5; done ) > $OUT/mem.log 2>&1 &
MEM=$!
timeout 520 python3 -m stitchcuda.cli bench .kb --pattern 'level2/*.py' --device cuda --rounds 0 --policy library --jobs 3 --out $OUT/l2 > $OUT/l2.log 2>&1; echo "bench rc $?" >> $OUT/l2.log
kill $MEM
tail -8 $OUT/l2.log
cd $OUT && tar czf l2.tgz l2 && rm -rf l2
