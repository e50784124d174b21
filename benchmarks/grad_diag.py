"""GPU gradient diagnosis: per-leaf max relative error of evtorch's gradients (generated kernels and the reference
executor on the GPU) against torch autograd of the eager epilogue, the contract's reference
(``fn(A.float() @ B.float(), **inputs)`` with inputs in their own dtype). Run: ``python benchmarks/grad_diag.py``.
"""
import torch, evtorch as evt
from evtorch.examples import EXAMPLES
fn, make = EXAMPLES["mixed_dag"]
torch.manual_seed(0)
M,N,K=300,200,136
for dtype in (torch.bfloat16, torch.float32):
  for backend in ("triton","reference"):
    torch.manual_seed(0)
    A=(torch.randn(M,K,device="cuda")*0.3).to(dtype).requires_grad_(); B=(torch.randn(K,N,device="cuda")*0.3).to(dtype).requires_grad_()
    inputs=make(M,N,"cuda",dtype)
    for v in inputs.values():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point: v.requires_grad_()
    out=evt.gemm(A,B,fn,backend=backend,**inputs)
    ref_inputs={k:(v.detach().clone().requires_grad_() if isinstance(v,torch.Tensor) and v.dtype.is_floating_point else v) for k,v in inputs.items()}
    Af,Bf=A.detach().float().requires_grad_(),B.detach().float().requires_grad_()
    ref=fn(Af@Bf,**ref_inputs)
    ws=[torch.randn(r.shape,device="cuda") for r in ref]
    names=["A","B"]+[k for k,v in inputs.items() if isinstance(v,torch.Tensor) and v.requires_grad]
    leaves=[A,B]+[v for v in inputs.values() if isinstance(v,torch.Tensor) and v.requires_grad]
    rl=[Af,Bf]+[v for v in ref_inputs.values() if isinstance(v,torch.Tensor) and v.requires_grad]
    got=torch.autograd.grad(sum((o.float()*w).sum() for o,w in zip(out,ws)),leaves,allow_unused=True)
    want=torch.autograd.grad(sum((r*w).sum() for r,w in zip(ref,ws)),rl,allow_unused=True)
    print(dtype, backend, {n: round(((g.float()-r.float()).abs().max()/r.float().abs().max()).item(),4) for n,g,r in zip(names,got,want) if r is not None},
          "fwd", [round(((o.float()-r).abs().max()/r.abs().max()).item(),4) for o,r in zip(out,ref)])
