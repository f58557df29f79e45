"""The first explanation's one-time cost against the model's own first gradient x input.

    python benchmarks/first_call.py                       # resnet50, EpsilonPlusFlat, 3 fresh processes each
    python benchmarks/first_call.py --model resnet18 --composite epsilon --processes 5

Each measurement is a fresh process (kernels, allocator and caches cold) that times calls 1 to 4
of one kind - gradient x input of the model, or ``fxlrp.attribute`` - on one 224 x 224 image;
the kinds alternate. Printed: the median of each call over the processes, and for each kind the
first call as a multiple of the median of calls 2 to 4. What fxlrp adds to a cold start is the
difference between the two multiples; the rest is torch's own (oneDNN creating kernels for new
shapes, the allocator growing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time, torch, torchvision
torch.manual_seed(0)
model = getattr(torchvision.models, sys.argv[1])().eval().requires_grad_(False)
x = torch.randn(1, 3, 224, 224)
kind, composite = sys.argv[2], sys.argv[3]
if kind == "gradient":
    def call():
        leaf = x.clone().requires_grad_()
        output = model(leaf)
        output[:, 0].sum().backward()
        return leaf.grad * leaf
else:
    import fxlrp
    from fxlrp.app.composites import composite_by_name
    from fxlrp.app.preprocessing import Preprocessing
    explain = fxlrp.convert(model, composite_by_name(composite, Preprocessing(224, 3, (0.5,) * 3, (0.5,) * 3)))
    def call():
        return fxlrp.attribute(explain, x, target=0)
times = []
for _ in range(4):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def run(model: str, kind: str, composite: str) -> list[float]:
    done = subprocess.run([sys.executable, "-c", CHILD, model, kind, composite], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--composite", default="epsilon_plus_flat", help="a command-line composite name")
    parser.add_argument("--processes", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[list[float]]] = {"gradient": [], "fxlrp": []}
    for _ in range(args.processes):
        for kind in runs:
            runs[kind].append(run(args.model, kind, args.composite))
    print(f"{args.model}, {args.composite}, {args.processes} fresh processes per kind; seconds per call (median)")
    print("| kind | call 1 | call 2 | call 3 | call 4 | call 1 / median of 2-4 |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, measured in runs.items():
        calls = [statistics.median(times[index] for times in measured) for index in range(4)]
        later = statistics.median(calls[1:])
        cells = " | ".join(f"{value:.3f}" for value in calls)
        print(f"| {'gradient x input' if kind == 'gradient' else 'fxlrp.attribute'} | {cells} | "
              f"{calls[0] / later:.2f}x |")


if __name__ == "__main__":
    main()
