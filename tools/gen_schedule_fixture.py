#!/usr/bin/env python3
"""Writes tests/fixtures/config/schedules.json and loss_scaler.json with DeepSpeed's own Python
implementations of the lr schedules (deepspeed/runtime/lr_schedules.py) and of the dynamic loss
scaler (deepspeed/runtime/fp16/loss_scaler.py), so the C++ tests compare against the reference
rather than against formulas restated by hand.

DeepSpeed itself need not be installed (its package import pulls in CUDA builders): the two files
are loaded straight from a source tree, with the two DeepSpeed helpers they use (a logger and
comm.get_rank) stubbed. Only torch is needed (Debian's python3-torch is enough).

    pip download deepspeed==0.19.8 --no-deps --no-binary :all: -d /tmp/ds
    tar xzf /tmp/ds/deepspeed-0.19.8.tar.gz -C /tmp/ds
    python3 tools/gen_schedule_fixture.py --deepspeed-src /tmp/ds/deepspeed-0.19.8 --only schedules

schedules.json comes from DeepSpeed 0.19.8. loss_scaler.json was made from 0.16.9 (whose
loss_scaler.py loads standalone; 0.19's imports DeepSpeed's config machinery): regenerate it with
`--deepspeed-src <0.16.9 tree> --only loss_scaler`.
"""
import argparse
import importlib.util
import json
import logging
import os
import random
import sys
import types

import torch


def load_deepspeed_modules(src):
    messages = []

    class Capture(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger("deepspeed_fixture")
    logger.setLevel(logging.INFO)
    logger.addHandler(Capture())
    logger.propagate = False

    ds = types.ModuleType("deepspeed")
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logger
    comm = types.ModuleType("deepspeed.comm")
    comm.get_rank = lambda: 0
    ds.utils = utils
    ds.comm = comm
    sys.modules.update({"deepspeed": ds, "deepspeed.utils": utils, "deepspeed.comm": comm})

    def load(name, rel):
        spec = importlib.util.spec_from_file_location(name, os.path.join(src, rel))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    lr = load("ds_lr_schedules", "deepspeed/runtime/lr_schedules.py")
    try:
        ls = load("ds_loss_scaler", "deepspeed/runtime/fp16/loss_scaler.py")
    except ImportError:
        ls = None  # 0.19's loss_scaler.py needs DeepSpeed's config machinery; see the docstring
    return lr, ls, messages


SCHEDULE_CASES = [
    ("warmup_log", "WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}, 30),
    ("warmup_linear", "WarmupLR",
     {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-4, "warmup_num_steps": 8, "warmup_type": "linear"}, 20),
    ("warmup_one_step", "WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 2e-4, "warmup_num_steps": 1}, 5),
    ("warmup_defaults", "WarmupLR", {}, 1005),
    ("decay_log", "WarmupDecayLR",
     {"total_num_steps": 50, "warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}, 60),
    ("decay_linear_short", "WarmupDecayLR",
     {"total_num_steps": 5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}, 15),
    ("cosine_log", "WarmupCosineLR",
     {"total_num_steps": 50, "warmup_min_ratio": 0.1, "warmup_num_steps": 10, "cos_min_ratio": 0.01}, 60),
    ("cosine_linear", "WarmupCosineLR",
     {"total_num_steps": 40, "warmup_num_steps": 5, "warmup_type": "linear"}, 45),
    ("onecycle_decay", "OneCycle",
     {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10, "cycle_second_step_size": 15,
      "decay_step_size": 5, "decay_lr_rate": 0.1, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
      "decay_mom_rate": 0.05}, 60),
    ("onecycle_plain", "OneCycle",
     {"cycle_min_lr": 2e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 7}, 40),
    ("onecycle_no_momentum", "OneCycle",
     {"cycle_min_lr": 1e-4, "cycle_max_lr": 5e-4, "cycle_first_step_size": 4, "cycle_momentum": False}, 20),
    # Stairs (DeepSpeed 0.19): the case from issue 12, the second count defaulting to the first,
    # counts that do not divide the half, an empty second half, and several cycles into the decay.
    ("onecycle_stairs", "OneCycle",
     {"cycle_min_lr": 2e-4, "cycle_max_lr": 3e-3, "cycle_first_step_size": 7, "cycle_second_step_size": 9,
      "cycle_first_stair_count": 3, "cycle_second_stair_count": 2, "decay_step_size": 3,
      "decay_lr_rate": 0.2, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.02}, 40),
    ("onecycle_stairs_second_default", "OneCycle",
     {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10, "cycle_second_step_size": 6,
      "cycle_first_stair_count": 4}, 30),
    ("onecycle_stairs_uneven", "OneCycle",
     {"cycle_min_lr": 3e-5, "cycle_max_lr": 7e-4, "cycle_first_step_size": 11, "cycle_second_step_size": 13,
      "cycle_first_stair_count": 5, "cycle_second_stair_count": 7, "decay_step_size": 4,
      "decay_lr_rate": 0.5}, 45),
    ("onecycle_stairs_first_only", "OneCycle",
     {"cycle_min_lr": 1e-4, "cycle_max_lr": 9e-4, "cycle_first_step_size": 8, "cycle_second_step_size": 0,
      "cycle_first_stair_count": 3}, 20),
    ("onecycle_second_zero_continuous", "OneCycle",
     {"cycle_min_lr": 1e-4, "cycle_max_lr": 9e-4, "cycle_first_step_size": 6, "cycle_second_step_size": 0,
      "decay_step_size": 2, "decay_lr_rate": 0.3}, 15),
    ("range_continuous", "LRRangeTest",
     {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5, "lr_range_test_step_rate": 2.0}, 30),
    ("range_staircase", "LRRangeTest",
     {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 4, "lr_range_test_step_rate": 0.5,
      "lr_range_test_staircase": True}, 30),
]

BASE_LR = 6e-4
BASE_BETAS = (0.9, 0.999)


def gen_schedules(lr_mod):
    cases = []
    for name, kind, params, last_t in SCHEDULE_CASES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.Adam([p], lr=BASE_LR, betas=BASE_BETAS)
        sched = getattr(lr_mod, kind)(opt, **params)
        group = opt.param_groups[0]
        ts, lrs, beta1s, beta2s = [-1], [group["lr"]], [group["betas"][0]], [group["betas"][1]]
        for t in range(0, last_t + 1):
            sched.step()
            assert sched.last_batch_iteration == t
            ts.append(t)
            lrs.append(group["lr"])
            beta1s.append(group["betas"][0])
            beta2s.append(group["betas"][1])
        cases.append({"name": name, "type": kind, "params": params, "base_lr": BASE_LR,
                      "base_betas": list(BASE_BETAS), "t": ts, "lr": lrs, "beta1": beta1s,
                      "beta2": beta2s})
    return cases


SCALER_CASES = [
    # name, init_scale, window, hysteresis, min_scale, consecutive_hysteresis, overflow pattern
    ("hysteresis2", 2.0**8, 4, 2, 1.0, False, "0010110000000000100001111000000000"),
    ("hysteresis1", 2.0**5, 3, 1, 1.0, False, "1000010001100000001000000"),
    ("consecutive", 2.0**8, 4, 3, 1.0, True, "1010101100110000000011100000010101000"),
    ("not_consecutive", 2.0**8, 4, 3, 1.0, False, "1010101100110000000011100000010101000"),
    ("min_scale", 2.0**3, 100, 1, 2.0, False, "01111"),
    ("window1", 1.0, 1, 2, 1.0, False, "000100011000"),
]


def gen_scaler(ls_mod, messages):
    cases = []
    rng = random.Random(1234)
    pattern = "".join("1" if rng.random() < 0.05 else "0" for _ in range(400))
    all_cases = SCALER_CASES + [("random_long", 2.0**16, 8, 2, 1.0, False, pattern)]
    for name, init, window, hyst, min_scale, consec, pat in all_cases:
        s = ls_mod.DynamicLossScaler(init_scale=init, scale_window=window, min_scale=min_scale,
                                     delayed_shift=hyst, consecutive_hysteresis=consec,
                                     dtype=torch.half)
        scales, hysts, logs = [], [], []
        error_at = None
        for i, ch in enumerate(pat):
            messages.clear()
            try:
                s.update_scale(ch == "1")
            except Exception as e:  # noqa: BLE001 - DeepSpeed raises a bare Exception
                error_at = i
                logs.append(str(e))
                break
            scales.append(s.cur_scale)
            hysts.append(s.cur_hysteresis)
            overflow_lines = [m.replace("[deepspeed] ", "") for m in messages if "OVERFLOW" in m]
            logs.append(overflow_lines[0] if overflow_lines else "")
        cases.append({"name": name, "init_scale": init, "scale_window": window, "hysteresis": hyst,
                      "min_scale": min_scale, "consecutive_hysteresis": consec, "overflow": pat,
                      "scale": scales, "cur_hysteresis": hysts, "log": logs, "error_at": error_at})
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deepspeed-src", required=True, help="root of an unpacked DeepSpeed source tree")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "config"))
    ap.add_argument("--only", choices=["schedules", "loss_scaler"], help="write just one of the two files")
    args = ap.parse_args()
    lr_mod, ls_mod, messages = load_deepspeed_modules(args.deepspeed_src)
    version = "unknown"
    vfile = os.path.join(args.deepspeed_src, "version.txt")
    if os.path.exists(vfile):
        version = open(vfile).read().strip()
    os.makedirs(args.out, exist_ok=True)
    note = f"generated by tools/gen_schedule_fixture.py from DeepSpeed {version}"
    written = []
    if args.only in (None, "schedules"):
        with open(os.path.join(args.out, "schedules.json"), "w") as f:
            json.dump({"generator": note, "cases": gen_schedules(lr_mod)}, f, indent=1)
            f.write("\n")
        written.append("schedules.json")
    if args.only in (None, "loss_scaler"):
        if ls_mod is None:
            sys.exit("this tree's loss_scaler.py does not load standalone: use a 0.16.x tree for --only loss_scaler")
        with open(os.path.join(args.out, "loss_scaler.json"), "w") as f:
            json.dump({"generator": note, "cases": gen_scaler(ls_mod, messages)}, f, indent=1)
            f.write("\n")
        written.append("loss_scaler.json")
    print(f"wrote {' and '.join(written)} to {os.path.normpath(args.out)} ({note})")

if __name__ == "__main__":
    main()
