set -x
mkdir -p $OUT/t $OUT/sk
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/t/gpu.txt
timeout 200 python3 benchmarks/training_bench.py --quick --out $OUT/t/train > $OUT/t/train_log.txt 2>&1
timeout 60 python3 -m benchmarks.host_overhead --device cuda --json $OUT/t/host_cuda.json > $OUT/t/host_log.txt 2>&1
timeout 60 python3 -m benchmarks.host_overhead --device cuda --real --json $OUT/t/host_real.json >> $OUT/t/host_log.txt 2>&1
C=splitk_tma_128x128x64_w8_s6_sk2,splitk_tma_128x128x64_w8_s6_sk3,splitk_tma_128x128x64_w8_s6_sk4,splitk_tma_128x128x64_w8_s6_sk5,splitk_tma_128x128x64_w8_s6_sk6,splitk_tma_128x128x64_w8_s6_sk7,splitk_tma_128x128x64_w8_s6_sk8,splitk_tma_128x256x64_w8_s4_sk2,splitk_tma_128x256x64_w8_s4_sk3,splitk_tma_128x256x64_w8_s4_sk4,splitk_tma_128x256x64_w8_s4_sk6,splitk_tma_128x256x64_w8_s4_sk8,tma_128x128x64_w8_s5_sub,tma_128x128x64_w4_s6_sub,tma_64x128x64_w4_s8,tma_64x64x128_w4_s6,splitk_16x64x128_sk4,splitk_16x64x128_sk8
timeout 330 python3 -m benchmarks.skinny_probe --out $OUT/sk --graph --no-tune --deadline-s 300 --shapes 128x2048x8192,128x3072x16384,256x1536x16384,128x2048x16384,256x2048x8192,128x4096x16384,128x14336x4096,128x4096x4096 --workloads identity --configs $C 2>&1 | grep -v "autotune\|^E1\|^ *$" > $OUT/sk/log.txt
cd $OUT && tar czf t.tgz t && tar czf sk.tgz sk && rm -rf t sk
