set -u
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
git_commit=$(cat COMMIT 2>/dev/null); echo "commit $git_commit" >> $OUT/gpu.txt
export STITCH_LOG_LEVEL=INFO
# A/B, one problem at a time, each from a fresh home (cold builds): the reference after the build (off)
# against the reference while the Coder writes and the build compiles (the default).
for mode in off cuda; do
  STITCH_HOME=$PWD/.device/home_$mode STITCH_REFERENCE_PREFETCH=$mode timeout 230 python3 -m stitchcuda.cli bench .kb --pattern 'pair/*.py' --device cuda --rounds 0 --policy library --jobs 1 --out $OUT/ab_$mode > $OUT/ab_$mode.log 2>&1; echo "bench rc $?" >> $OUT/ab_$mode.log
  tail -6 $OUT/ab_$mode.log
done
timeout 100 python3 -m pytest -m gpu tests/gpu/test_synth_reduce_gpu.py -x -q -p no:cacheprovider > $OUT/reduce_gpu.log 2>&1; echo "pytest rc $?" >> $OUT/reduce_gpu.log
tail -3 $OUT/reduce_gpu.log
cd $OUT && tar czf logs.tgz ab_off ab_cuda 2>/dev/null; rm -rf ab_off ab_cuda
