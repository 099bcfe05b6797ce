#!/usr/bin/env python3
"""Writes tests/fixtures/zero/estimates.json from DeepSpeed's own memory estimator
(deepspeed/runtime/zero/stage_1_and_2.py and stage3.py): the numbers of every option and the
tables the *_all_cold functions print, so the C++ estimator is checked against the reference
rather than against formulas restated by hand.

Needs the `deepspeed` package (PyPI; it imports on a CPU-only machine), e.g. in a throwaway venv:

    python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install torch deepspeed
    /tmp/dsvenv/bin/python tools/gen_estimate_fixture.py

Python 3.11 formats DeepSpeed's offload device enum as "OffloadDeviceEnum.cpu" where older Pythons
printed "cpu "; the fixture keeps the intended "cpu " (deepspeed.cpp prints that).
"""
import contextlib
import io
import json
import os

import deepspeed
from deepspeed.runtime.zero import stage3, stage_1_and_2

CASES = [
    # (name, total params, largest layer, gpus per node, nodes, additional_buffer_factor)
    ("t0_3b", 2783959040, 65798144, 1, 1, 1.5),  # the docs' bigscience/T0_3B example
    ("gpt2_124m", 124439808, 38597376, 1, 1, 1.5),
    ("gpt2_xl_8x2", 1557611200, 80411200, 8, 2, 1.5),
    ("llama7b_4x1", 6738415616, 131072000, 4, 1, 1.2),
    ("odd_3x5", 987654321, 12345678, 3, 5, 2.0),
    ("tiny_2", 16090112, 12865792, 2, 1, 1.5),
]


def table(fn, *args, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args, **kw)
    return buf.getvalue().replace("OffloadDeviceEnum.cpu", "cpu ")


def main():
    out = []
    for name, p, l, g, n, abf in CASES:
        z2 = [list(stage_1_and_2.estimate_zero2_model_states_mem_needs(p, g, n, off, abf)) for off in (True, False)]
        z3 = []
        for off in (True, False):
            for off_p in (True, False):
                if not off and off_p:
                    continue
                for zi in (True, False):
                    cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(p, l, g, n, off, off_p, zi, abf)
                    z3.append({"cpu_offload": off, "cpu_offload_params": off_p, "zero_init": zi, "cpu": cpu, "gpu": gpu})
        out.append({
            "name": name, "params": p, "largest_layer": l, "gpus_per_node": g, "nodes": n, "abf": abf,
            "zero2": [{"cpu_offload": off, "cpu": c, "gpu": gg} for off, (c, gg) in zip((True, False), z2)],
            "zero3": z3,
            "zero2_table": table(stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold, p, g, n, abf),
            "zero3_table": table(stage3.estimate_zero3_model_states_mem_needs_all_cold, p, l, g, n, abf),
        })
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "zero", "estimates.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"generator": f"tools/gen_estimate_fixture.py from DeepSpeed {deepspeed.__version__}",
                   "cases": out}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
