#!/usr/bin/env python3
"""Write tests/fixtures/parity/{gpt2,llama}_bf16.safetensors: PyTorch's own bf16 results for
test_bf16_parity, next to a float64 reference, so that the C++ test can demand that our bf16
numerics be no worse than a small multiple of PyTorch's.

Model, parameters and batch are those of the fp32 parity fixture (tests/fixtures/parity/
<layout>.safetensors, written by tools/gen_parity_fixture.py, whose reference modules are imported
here): the parameters are read from that file and rounded to bf16 (round to nearest even, what our
engine does when it flattens them into its bf16 buffer). Every result below starts from those SAME
bf16-valued parameters, so the float64 reference differs from each bf16 run by that run's
arithmetic alone, not by the parameter rounding they all share.

Three runs, each forward + backward of the mean cross-entropy:
  ref        float64 module (parameters: the bf16 values, exactly widened)
  torch_bf16 the module in bf16 (model.to(torch.bfloat16)): bf16 parameters, activations and
             gradients. DeepSpeed's bf16 mode, and ours (docs/precision.md).
  autocast   fp32 module (parameters: the bf16 values, held in fp32) under
             torch.autocast("cpu", dtype=torch.bfloat16). On the CPU autocast casts to bf16 for
             matmul/linear (lower_precision_fp list) and to fp32 for cross_entropy; softmax,
             layer_norm and elementwise ops run in their input's dtype (they are NOT on the CPU
             fp32 list, unlike CUDA's), so the residual stream stays fp32 (embedding outputs fp32,
             fp32 + bf16 promotes) while attention and the MLP interior are bf16.

Each fixture holds (names prefixed ref., torch_bf16., autocast.)
  <run>.logits   (B, T, V)   F32 for ref, BF16 for the two bf16 runs (their logits are bf16)
  <run>.loss     scalar F32 (the bf16 run's bf16 loss, widened)
  <run>.grad.<name>  every parameter gradient: F32 for ref and autocast (fp32 parameters), BF16 for
                 torch_bf16
  input_ids, targets (I64): copies of the parity fixture's, so the test can check they agree
and metadata: config, source (the parity fixture), torch version, the autocast dtype of each op
kind as observed during the run.

Needs PyTorch and safetensors (a virtual environment outside the project, e.g.
`python3 -m venv $VENV && $VENV/bin/pip install torch safetensors`):

    $VENV/bin/python tools/gen_bf16_parity_fixture.py [--out tests/fixtures/parity]
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_parity_fixture as base  # noqa: E402  (the reference modules and configs)


write_safetensors = base.write_safetensors


def run(model, ids, targets, V, autocast=False):
    """Forward + backward; returns logits, loss and {name: grad} (as the run produced them)."""
    model.zero_grad(set_to_none=True)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
            loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    else:
        logits = model(ids)
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def observe_autocast_dtypes(model, ids, V, targets):
    """The output dtype of each module kind under CPU autocast (written to the metadata)."""
    seen = {}

    def hook(m, inputs, out):  # returns None: the output is left as it is
        seen.setdefault(type(m).__name__, str(out.dtype).replace("torch.", ""))

    hooks = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(2, 4, 8)
        seen["softmax"] = str(x.bfloat16().softmax(-1).dtype).replace("torch.", "")
        logits = model(ids)
        seen["logits"] = str(logits.dtype).replace("torch.", "")
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
        seen["cross_entropy"] = str(loss.dtype).replace("torch.", "")
    for h in hooks:
        h.remove()
    return seen


def make_fixture(layout, out_dir, src_dir):
    cfg = base.CONFIGS[layout]
    src_path = os.path.join(src_dir, layout + ".safetensors")
    src = load_file(src_path)
    ids, targets = src["input_ids"], src["targets"]
    V = cfg["vocab_size"]
    params16 = {k[len("param."):]: v.to(torch.bfloat16) for k, v in src.items()
                if k.startswith("param.")}

    def model_with(dtype):
        m = (base.GPT2 if layout == "gpt2" else base.Llama)(cfg)
        names = {n for n, _ in m.named_parameters()}
        assert names == set(params16), f"parameter sets differ: {names ^ set(params16)}"
        m = m.to(dtype)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(params16[n].to(dtype))  # exact: bf16 values widen exactly
        return m

    ref = run(model_with(torch.float64), ids, targets, V)
    b16 = run(model_with(torch.bfloat16), ids, targets, V)
    ac_model = model_with(torch.float32)
    ac = run(ac_model, ids, targets, V, autocast=True)
    assert b16[0].dtype == torch.bfloat16 and ac[0].dtype == torch.bfloat16
    assert ac[1].dtype == torch.float32 and b16[1].dtype == torch.bfloat16
    observed = observe_autocast_dtypes(ac_model, ids, V, targets)

    tensors = {"input_ids": ids, "targets": targets}
    for tag, (logits, loss, grads), gdt in (("ref", ref, torch.float32),
                                            ("torch_bf16", b16, torch.bfloat16),
                                            ("autocast", ac, torch.float32)):
        tensors[tag + ".logits"] = logits.to(torch.float32 if tag == "ref" else torch.bfloat16)
        tensors[tag + ".loss"] = loss.to(torch.float32).reshape(())
        for n, g in grads.items():
            assert tag != "torch_bf16" or g.dtype == torch.bfloat16
            tensors[f"{tag}.grad.{n}"] = g.to(gdt)
    meta = {
        "config": json.dumps(cfg),
        "source": "tests/fixtures/parity/" + layout + ".safetensors (parameters rounded to bf16)",
        "generator": "tools/gen_bf16_parity_fixture.py",
        "torch": torch.__version__,
        "autocast_cpu_dtypes": json.dumps(observed, sort_keys=True),
    }
    path = os.path.join(out_dir, layout + "_bf16.safetensors")
    write_safetensors(path, tensors, meta)
    size = os.path.getsize(path)
    assert size < 400_000, f"{path} is {size} bytes; keep fixtures small"

    def err(a, r):
        return ((a.double() - r.double()).abs().max() / r.double().abs().max()).item()

    worst = lambda run_: max(err(run_[2][n], ref[2][n]) for n in ref[2])
    print(f"{path}: {size} bytes; loss ref {ref[1].item():.6f} bf16 {b16[1].item():.6f} "
          f"autocast {ac[1].item():.6f}; logits err bf16 {err(b16[0], ref[0]):.2e} autocast "
          f"{err(ac[0], ref[0]):.2e}; worst grad err bf16 {worst(b16):.2e} autocast {worst(ac):.2e}")
    print(f"  autocast dtypes: {observed}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.normpath(os.path.join(here, "..", "tests", "fixtures", "parity"))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default)
    ap.add_argument("--src", default=default, help="where the fp32 parity fixtures are")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for layout in ("gpt2", "llama"):
        make_fixture(layout, args.out, args.src)


if __name__ == "__main__":
    main()
