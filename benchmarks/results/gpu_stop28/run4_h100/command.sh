set -u
cd .clean && ln -sfn ../.whl .whl && ln -sfn ../.kb .kb && . benchmarks/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt; cat COMMIT >> $OUT/gpu.txt
export STITCH_LOG_LEVEL=WARNING STITCH_HOME=$PWD/.device/home_warm
for p in 12_Gemm_Multiply_LeakyReLU 22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish 19_ConvTranspose2d_GELU_GroupNorm; do
  echo "== $p" >> $OUT/warm.log
  timeout 150 python3 benchmarks/warm_verify.py .kb/warm/$p/reference.py .kb/warm/$p/cand --device cuda --times 3 --policy library >> $OUT/warm.log 2>&1; echo "rc $?" >> $OUT/warm.log
done
cat $OUT/warm.log | cut -c1-400
