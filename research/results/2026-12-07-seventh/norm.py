import time, torch
from workers.runner import ModelRunner
r = ModelRunner.load("default")
norm = r.layers[3].input_layernorm
print(type(norm), norm.variance_epsilon)
for S in (24, 180, 1074):
    x = torch.randn(S, 576)
    for name, f in (("hf", lambda: norm(x)), ("F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (576,), norm.weight, norm.variance_epsilon))):
        for _ in range(20): f()
        t = time.perf_counter()
        for _ in range(200): y = f()
        dt = (time.perf_counter() - t) / 200
        print(S, name, f"{dt*1e6:.0f} us", "equal" if torch.equal(f(), norm(x)) else f"maxdiff {float((f()-norm(x)).abs().max()):.2e}")
