#!/usr/bin/env bash
# Run the GPU selftest in N parallel processes (Triton compilation is CPU-bound) and merge the summaries.
# usage: bash benchmarks/selftest_parallel.sh OUTDIR [N] [--quick]
set -u
out=${1:?outdir}; n=${2:-12}; shift 2 || true
export EVTORCH_AUTOTUNE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
for ((i = 0; i < n; i++)); do
  python3 -m evtorch.selftest "$@" --shard "$i/$n" --json "$out/selftest_$i.json" > "$out/selftest_$i.log" 2>&1 &
done
wait
python3 - "$out" <<'PY'
import json, glob, sys
res = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/selftest_*.json"))]
p = sum(r["passed"] for r in res); f = sum(r["failed"] for r in res)
err = {}
for r in res:
    for k, v in r["max_error"].items():
        err[k] = max(err.get(k, 0), v)
print(f"evtorch selftest on {res[0]['device']} (torch {res[0]['torch']}, triton {res[0]['triton']}): "
      f"{p} passed, {f} failed, slowest shard {max(r['seconds'] for r in res)} s")
for k, v in sorted(err.items()):
    print(f"  max relative error {k:9s}: {v:.2e}")
for r in res:
    for x in r["failures"]:
        print("  FAIL", x)
json.dump(dict(passed=p, failed=f, max_error=err, failures=[x for r in res for x in r["failures"]],
               device=res[0]["device"]), open(sys.argv[1] + "/selftest_summary.json", "w"), indent=1)
PY
