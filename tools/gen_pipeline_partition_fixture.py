#!/usr/bin/env python3
"""Writes tests/fixtures/pipeline/partitions.json: DeepSpeed's own layer partitions
(deepspeed.runtime.utils.partition_uniform / partition_balanced, as PipelineModule's
partition_method "uniform" and "parameters" / "type:<regex>" use them) for a set of cases, which
tests/test_pipeline_partition.cpp compares with ours.

    python tools/gen_pipeline_partition_fixture.py   # in a venv with deepspeed (any CPU machine)
"""
import json
import os
import random

from deepspeed.runtime.utils import partition_balanced, partition_uniform

random.seed(1234)
cases = []
for n, p in [(1, 1), (3, 4), (4, 4), (5, 2), (7, 3), (12, 4), (26, 4), (50, 8), (13, 5)]:
    cases.append({"method": "uniform", "n": n, "parts": p, "want": partition_uniform(n, p)})
weight_sets = [
    [1, 1, 1, 1],
    [5, 1, 1, 1, 1, 5],
    [38597376, 7087872, 7087872, 7087872, 7087872, 7087872, 7087872, 1536, 38597376],  # GPT-2 124M-like
    [0, 3, 3, 3, 0, 3, 3, 0],
]
for _ in range(12):
    n = random.randint(2, 30)
    weight_sets.append([random.choice([0, random.randint(1, 100), random.randint(1, 10**6)])
                        for _ in range(n)])
for w in weight_sets:
    for p in [1, 2, 3, 4, 8]:
        cases.append({"method": "balanced", "weights": w, "parts": p,
                      "want": [int(x) for x in partition_balanced(w, p)]})

out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "pipeline", "partitions.json")
with open(out, "w") as f:
    json.dump({"generator": "tools/gen_pipeline_partition_fixture.py", "cases": cases}, f, indent=0)
print(f"{len(cases)} cases -> {out}")
