"""A DCGAN-style generator (a 100-vector to a 3x32x32 image: ConvTranspose2d 4x4 from the 1x1 input, then
three 4x4 stride-2 ones, BatchNorm, ReLU, tanh), batch 1 and 8, default and channels-last layout, through
``torch.compile(backend="pbsdk")`` against Inductor and eager: wall time per call, the best of 10 calls a
round, 7 interleaved rounds, median; the ratio's range over rounds in brackets; max error against eager.

    PYTHONPATH=. .venv/bin/python benchmarks/dcgan.py [THREADS]
"""
import sys, time, statistics, torch, torch.nn as nn
import pbsdk
from pbsdk.bench import cpu_model
th = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(th)
torch.manual_seed(0)
def G():
    return nn.Sequential(
        nn.ConvTranspose2d(100, 256, 4, 1, 0, bias=False), nn.BatchNorm2d(256), nn.ReLU(True),
        nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(True),
        nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
        nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh()).eval()
clock = time.perf_counter
def best(fn, n):
    b = 1e9
    for _ in range(n):
        t = clock(); fn(); b = min(b, clock() - t)
    return b
print(cpu_model(), f"{th} thread(s)")
for batch in (1, 8):
    for cl in (False, True):
        m = G()
        x = torch.randn(batch, 100, 1, 1)
        if cl:
            m = m.to(memory_format=torch.channels_last); x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            p = torch.compile(m, backend="pbsdk", dynamic=False, options={"compile_options": {"threads": th}})
            i = torch.compile(m, dynamic=False)
            ref = m(x)
            errp = float((p(x) - ref).abs().max()); erri = float((i(x) - ref).abs().max())
            time.sleep(5)
            r = {"pbsdk": [], "inductor": [], "eager": []}
            for _ in range(7):
                for k, f in (("pbsdk", p), ("inductor", i), ("eager", m)):
                    r[k].append(best(lambda f=f: f(x), 10))
            med = {k: statistics.median(v) * 1e3 for k, v in r.items()}
            ratios = sorted(a / b for a, b in zip(r["inductor"], r["pbsdk"]))
            print(f"batch {batch} {'channels_last' if cl else 'default'}: pbsdk {med['pbsdk']:.3f} ms, Inductor {med['inductor']:.3f}, eager {med['eager']:.3f}; x Inductor {statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]; err {errp:.1e} (inductor {erri:.1e})", flush=True)
