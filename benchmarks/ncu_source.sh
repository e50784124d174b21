#!/bin/bash
# Per-SASS-instruction warp-stall samples of chosen (workload, config) kernels (Nsight Compute, full set), for
# finding where a kernel's warps wait. Usage on the GPU machine (OUT set):
#   bash benchmarks/ncu_source.sh M,N,K JOB [JOB ...]      (JOB as for benchmarks.ncu_probe)
# Writes OUT/ncu_full.txt (details page), OUT/ncu_source.csv.gz (source page, SASS, every kernel) and
# OUT/ncu_times.txt (median times with L2 flushed); summarize with python -m benchmarks.ncu_probe --stalls FILE.
set -u
shape=$1; shift
export PYTHONPATH=. TRITON_INTERPRET=0 EVTORCH_AUTOTUNE=0
python3 -m benchmarks.ncu_probe --shape "$shape" "$@" > "$OUT/ncu_times.txt" 2>&1
ncu --clock-control none --profile-from-start off -k regex:'gemm_|nvjet|sm90' --set full --import-source no \
    -o /tmp/ncu_full -f python3 -m benchmarks.ncu_probe --shape "$shape" "$@" > "$OUT/ncu_run_log.txt" 2>&1
ncu -i /tmp/ncu_full.ncu-rep --page details > "$OUT/ncu_full.txt" 2>&1
ncu -i /tmp/ncu_full.ncu-rep --page source --csv --print-source sass 2> "$OUT/ncu_source_err.txt" | gzip > "$OUT/ncu_source.csv.gz"
ls -la /tmp/ncu_full.ncu-rep "$OUT"
gzip -c /tmp/ncu_full.ncu-rep > /tmp/ncu_full.ncu-rep.gz
if [ "$(stat -c %s /tmp/ncu_full.ncu-rep.gz)" -lt 16000000 ]; then cp /tmp/ncu_full.ncu-rep.gz "$OUT/"; fi
