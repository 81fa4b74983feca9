import torch, time
from workers.batching.layer import attend_newest
T=1100
q=torch.randn(9,64)
for dt in (torch.float32, torch.bfloat16, torch.float16):
    k=torch.randn(3,T,64).to(dt); v=torch.randn(3,T,64).to(dt); qq=q.to(dt)
    for _ in range(50): attend_newest(qq,k,v,None)
    best=1e9
    for _ in range(5):
        t=time.perf_counter()
        for _ in range(300): attend_newest(qq,k,v,None)
        best=min(best,(time.perf_counter()-t)/300)
    print(dt, round(best*1e6,1), "us per layer")
