"""Where the ping-pong kernel with three consumers and the epilogue input through the loader (CONSUMERS=3 with
EPI_TMA, which ``GemmConfig`` rejects since 2026-11-26) goes wrong: lincomb_relu with NaN-poisoned outputs on
several shapes, three consumers on quarters and halves against two consumers on quarters; per run the NaN count,
how many 128 x 128 tiles hold them, their columns modulo 128, and the largest error among the written elements.
The config is built past the validation (``object.__setattr__``). Needs a Hopper GPU::

    TRITON_INTERPRET=0 python benchmarks/c3_epi_tma_probe.py     # writes $OUT/probe_c3.json (or ./probe_c3.json)
"""
import json
import os
import torch
import evtorch as evt
from evtorch.codegen.configs import GemmConfig
from evtorch.examples import EXAMPLES, eager_reference, operands
from evtorch.runtime import gemm as rg


SHAPES = ((4096, 3000, 1000), (4096, 3072, 1024), (4096, 3072, 64), (1024, 768, 512), (2048, 2048, 1024),
          (8192, 4096, 1024))


def cfg(consumers, stages, sub):
    c = GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, stages, (("EPILOGUE_SUBTILE", sub), ("EPI_TMA", True)))
    object.__setattr__(c, "extra", tuple(c.extra) + ((("CONSUMERS", consumers),) if consumers != 2 else ()))
    return c


def main() -> None:
    os.environ["EVTORCH_POISON"] = "1"
    os.environ["EVTORCH_AUTOTUNE"] = "0"
    out = []
    ex = EXAMPLES["lincomb_relu"]
    for consumers, stages, sub in ((3, 3, 4), (3, 3, 2), (2, 4, 4)):
        for M, N, K in SHAPES:
            rg.clear_caches()
            torch.manual_seed(0)
            A, B = operands(M, N, K, "cuda", torch.bfloat16)
            inp = ex.make_inputs(M, N, "cuda", torch.bfloat16)
            rec = {"consumers": consumers, "stages": stages, "sub": sub, "shape": [M, N, K]}
            try:
                o = evt.gemm(A, B, ex.fn, config=cfg(consumers, stages, sub), **inp)
                torch.cuda.synchronize()
                nan = torch.isnan(o.float())
                rec["nan"] = int(nan.sum())
                if rec["nan"]:
                    tm, tn = (M + 127) // 128, (N + 127) // 128
                    t = torch.nn.functional.pad(nan, (0, tn * 128 - N, 0, tm * 128 - M)).view(tm, 128, tn, 128)
                    per_tile = t.sum(dim=(1, 3))
                    rec["tiles_hit"], rec["tiles"] = int((per_tile > 0).sum()), tm * tn
                    rec["per_tile_counts"] = sorted(set(per_tile[per_tile > 0].tolist()))[:8]
                    cols = nan.any(dim=0).nonzero().flatten()
                    rec["col_mod_128"] = sorted(set((cols % 128).tolist()))[:40]
                    lin = (per_tile > 0).flatten().nonzero().flatten()
                    rec["first_tiles"] = lin[:12].tolist()
                    ref = eager_reference(ex.fn, A, B, **inp)
                    rec["max_err_written"] = float(((o.float() - ref).abs()[~nan]).max() / ref.abs().max())
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(rec), flush=True)
            out.append(rec)
    json.dump(out, open(os.environ.get("OUT", ".") + "/probe_c3.json", "w"), indent=1)


if __name__ == "__main__":
    main()
