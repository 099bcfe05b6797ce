#!/usr/bin/env python3
"""Writes tests/fixtures/pipeline/schedules.json: the instruction streams of DeepSpeed's own
TrainSchedule (synchronous 1F1B) and InferenceSchedule (deepspeed/runtime/pipe/schedule.py) for
every stage of p = 1..5 stages and m = 1..9 micro-batches, which tests/test_pipeline_schedule.cpp
compares with runtime::train_schedule / inference_schedule.

    python tools/gen_pipeline_schedule_fixture.py   # in a venv with deepspeed (any CPU machine)

Each step is a list of "Name" or "Name:buffer_id" strings, as DeepSpeed's instructions print.
"""
import json
import os

from deepspeed.runtime.pipe import schedule as S


def encode(cmds):
    out = []
    for c in cmds:
        name = type(c).__name__
        out.append(f"{name}:{c.kwargs['buffer_id']}" if "buffer_id" in c.kwargs else name)
    return out


cases = []
for p in range(1, 6):
    for m in range(1, 10):
        for s in range(p):
            for kind, cls in (("train", S.TrainSchedule), ("inference", S.InferenceSchedule)):
                sched = cls(micro_batches=m, stages=p, stage_id=s)
                cases.append({"kind": kind, "stages": p, "micro_batches": m, "stage": s,
                              "steps": [encode(c) for c in sched.steps()]})

out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "pipeline", "schedules.json")
with open(out, "w") as f:
    json.dump({"generator": "tools/gen_pipeline_schedule_fixture.py", "cases": cases}, f,
              separators=(",", ":"))
print(f"{len(cases)} cases -> {out}")
