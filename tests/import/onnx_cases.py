"""What the ONNX import tests share: export a torch module as the README says (opset 13,
training mode, constant folding), import it with `halotrain import`, and compare with the
module itself in float64: training sharded (every weight after 3 steps, within the
oracle's tolerance or ENVELOPE times PyTorch's own float32 distance from float64) or
predicting (the probabilities of a sharded predict against the module's eval forward).

Set BIN and WORK before use; check() collects failures in FAILED.
"""
import copy
import os
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import oracle  # noqa: E402  (data order, memory check, tolerances)

BIN, WORK = None, None
FAILED = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    if not ok:
        FAILED.append(name)


# A weight may differ from float64 by ENVELOPE times PyTorch's own float32 distance where
# that exceeds the tolerance: Adam divides each gradient by its own size, so where the
# true gradient is small (a conv bias before an instance norm) rounding moves a weight by
# as much as the gradient does (nnU-Net's norms block: 5.8 times the tolerance).
ENVELOPE = 3.0


def keras_of(name, t):
    """A torch parameter or buffer in the Keras layout of its halotrain weight."""
    v = t.detach().double().numpy()
    if v.ndim == 4:
        return v.transpose(2, 3, 1, 0)
    if v.ndim == 2:
        return v.T
    return v


def keras_layout(wname, tname, tensor, shape):
    if wname == "depthwise_kernel:0":
        return tensor.detach().double().numpy()[:, 0].transpose(1, 2, 0).reshape(shape)
    return keras_of(tname, tensor).reshape(shape)


def train_torch(module, dtype, images, y, targets, loss_fn):
    """The module trained the oracle's steps with Adam at `dtype` on the test's data order."""
    ref = module.to(dtype).train()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-4)
    x_all = torch.tensor(images, dtype=dtype).permute(0, 3, 1, 2)
    for step in range(oracle.STEPS):
        idx = oracle.samples_of_step(step, len(images))
        opt.zero_grad()
        t = torch.tensor(y[idx], dtype=torch.int64) if targets == "labels" else \
            torch.tensor(y[idx], dtype=dtype).permute(0, 3, 1, 2)
        loss_fn(ref(x_all[idx]), t).backward()
        opt.step()
    return ref


def export(module, shape, path, opset=13):
    module.train()
    torch.onnx.export(module, torch.zeros(*shape), path, opset_version=opset, do_constant_folding=True,
                      training=torch.onnx.TrainingMode.TRAINING)


def match_weights(init_path, module):
    """halotrain (layer, weight) -> the torch tensor with the same initial values."""
    named = list(module.named_parameters()) + [(n, b) for n, b in module.named_buffers() if b.dtype.is_floating_point]
    out = {}
    with h5py.File(init_path, "r") as f:
        for layer in f.attrs["layer_names"]:
            layer = layer.decode()
            for w in f[layer].attrs["weight_names"]:
                w = w.decode().split("/")[-1]
                v = np.asarray(f[layer][layer][w], dtype=np.float64)
                # A Linear read as a 1x1 conv, a [C, 1, 1] layer scale as (C,): the same values.
                hits = [(n, t) for n, t in named if t.numel() == v.size and np.array_equal(keras_of(n, t).reshape(v.shape), v)]
                if w == "depthwise_kernel:0":  # [cin * m][1][k][k] -> (k, k, cin, m)
                    hits = [(n, t) for n, t in named if t.dim() == 4 and t.shape[1] == 1 and t.numel() == v.size and np.array_equal(
                        t.detach().double().numpy()[:, 0].transpose(1, 2, 0).reshape(v.shape), v)]
                out[(layer, w)] = hits[0][0] if len(hits) == 1 else None
    return out


def case(tag, module, shape, targets, loss_fn, grid=(2, 2), opset=13):
    """Exports `module`, imports it, trains it 3 steps sharded on `grid` from the imported
    weights, and compares every weight with the module trained in float64 (Adam)."""
    work = os.path.join(WORK, tag)
    os.makedirs(work)
    path = os.path.join(work, f"{tag}.onnx")
    export(module, shape, path, opset)
    r = subprocess.run([BIN, "import", path], capture_output=True, text=True, timeout=300)
    cfg, init = os.path.join(work, f"{tag}.yaml"), os.path.join(work, f"{tag}-init.h5")
    check(f"{tag}: import exits 0 and writes the config and the weights",
          r.returncode == 0 and os.path.exists(cfg) and os.path.exists(init), r.stdout + r.stderr[-3000:])
    if r.returncode != 0:
        return
    mapping = match_weights(init, module)
    missing = [k for k, v in mapping.items() if v is None]
    check(f"{tag}: every imported weight is a torch tensor's initial value ({len(mapping)} tensors)", not missing,
          f"unmatched {missing[:5]}")
    if missing:
        return
    # Data, and the reference: the module itself in float64 on the whole image.
    rng = np.random.default_rng(12)
    n, c, h, w = oracle.COUNT, shape[1], shape[2], shape[3]
    images = rng.uniform(0, 1, (n, h, w, c)).astype(np.float32)
    data = os.path.join(work, "data.h5")
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=images)
        if targets == "labels":
            y = rng.integers(0, 2, n).astype(np.int32)
        else:
            y = (rng.uniform(0, 1, (n, h, w, 1)) > 0.6).astype(np.uint8)
        f.create_dataset(targets, data=y)
    ref32 = train_torch(copy.deepcopy(module), torch.float32, images, y, targets, loss_fn)
    ref = train_torch(module, torch.float64, images, y, targets, loss_fn)
    run_dir = os.path.join(work, "run")
    sets = [f"data.train={data}", f"data.targets={targets}", "data.synthesize=null", f"seed={oracle.SEED}",
            f"training.batch_size={oracle.BATCH}", f"training.steps={oracle.STEPS}", "training.optimizer.lr=0.001",
            "training.optimizer.epsilon=0.0001", f"parallel.grid=[{grid[0]},{grid[1]}]",
            "parallel.device_memory=4GiB",
            f"run_dir={run_dir}", "checkpoint.every_steps=0"]
    r = subprocess.run([BIN, "train", cfg] + [a for s in sets for a in ("--set", s)], capture_output=True, text=True,
                       timeout=600, cwd=work)
    ck = os.path.join(run_dir, "checkpoints", f"ckpt-{oracle.STEPS}.h5")
    check(f"{tag}: trains 3 steps sharded {grid[0]}x{grid[1]} from the imported weights",
          r.returncode == 0 and os.path.exists(ck),
          r.stderr[-3000:])
    if r.returncode != 0:
        return
    worst, bad = 0.0, []
    # Module.double() replaced the buffers: read every tensor by name now.
    tensors = dict(ref.named_parameters()) | dict(ref.named_buffers())
    tensors32 = dict(ref32.named_parameters()) | dict(ref32.named_buffers())
    with h5py.File(ck, "r") as f:
        for (layer, wname), tname in mapping.items():
            tensor = tensors[tname]
            got = np.asarray(f[layer][layer][wname], dtype=np.float64)
            want, want32 = (keras_layout(wname, tname, t, got.shape) for t in (tensor, tensors32[tname]))
            spread = ENVELOPE * np.abs(want32 - want).max()
            ratio = np.abs(got - want) / (oracle.ATOL + oracle.RTOL * np.abs(want) + spread)
            worst = max(worst, float(ratio.max()))
            if (ratio > 1).any():
                bad.append(f"{layer}/{wname} ({tname})")
    mem, line = oracle.check_memory(run_dir)
    check(f"{tag}: every weight equals PyTorch float64 after 3 steps (worst {worst:.3g} of the allowance); {line}",
          not bad and not mem, f"{bad[:5]} {mem}")



def randomize(module, seed):
    """Every parameter and batch-norm statistic distinct and float32-exact: constant
    initialisations (ones, zeros, ConvNeXt's 1e-6 layer scale) perturbed, so that each
    imported weight is found by its values and the test exercises them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.dtype.is_floating_point:
                continue
            noise = torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1
            if "running_var" in name:
                t.copy_(0.5 + noise.abs())
            elif t.numel() > 1 and float(t.std()) > 0:
                t.add_(0.05 * noise * float(t.std()))
            else:
                t.copy_(t + 0.1 * noise * max(float(t.abs().max()), 0.5) + (0.5 if float(t.abs().max()) < 1e-3 else 0))
            t.copy_(t.float())
    return module


def predict_case(tag, module, shape, grid=(2, 2), opset=13, atol=2e-5, rtol=2e-4, channels=None):
    """Exports `module`, imports it, and predicts a few images on `grid` with the plain
    weights file the import wrote; the probabilities equal the module's eval forward in
    float64 (softmax over the classes, per image or per pixel).

    channels: imported with `--channels N` and fed N-channel images; the reference feeds
    the module what the converted first conv computes: for N = 1 the gray image in every
    channel, else image channel c added into the module's channel c % C times C / N."""
    work = os.path.join(WORK, tag)
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"{tag}.onnx")
    export(module, shape, path, opset)
    r = subprocess.run([BIN, "import", path] + (["--channels", str(channels)] if channels else []),
                       capture_output=True, text=True, timeout=300)
    cfg, init = os.path.join(work, f"{tag}.yaml"), os.path.join(work, f"{tag}-init.h5")
    check(f"{tag}: import exits 0", r.returncode == 0 and os.path.exists(cfg), (r.stdout + r.stderr)[-2000:])
    if r.returncode != 0:
        return
    rng = np.random.default_rng(3)
    n, c, h, w = 2, channels or shape[1], shape[2], shape[3]
    images = rng.uniform(0, 1, (n, h, w, c)).astype(np.float32)
    data, out = os.path.join(work, "images.h5"), os.path.join(work, "predictions.h5")
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=images)
    sets = [f"parallel.grid=[{grid[0]},{grid[1]}]", "parallel.device_memory=4GiB", "training.batch_size=2",
            f"run_dir={os.path.join(work, 'run')}"]
    r = subprocess.run([BIN, "predict", cfg, "--checkpoint", init, "--input", data, "--output", out] +
                       [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=600, cwd=work)
    check(f"{tag}: predict on a {grid[0]}x{grid[1]} grid from the imported weights exits 0",
          r.returncode == 0 and os.path.exists(out), (r.stdout + r.stderr)[-2000:])
    if r.returncode != 0:
        return
    x = torch.tensor(images, dtype=torch.float64).permute(0, 3, 1, 2)
    if channels == 1:
        x = x.repeat(1, shape[1], 1, 1)
    elif channels:
        fed = torch.zeros((n, shape[1], h, w), dtype=torch.float64)
        for k in range(channels):
            fed[:, k % shape[1]] += x[:, k] * shape[1] / channels
        x = fed
    with torch.no_grad():
        ref = module.double().eval()(x)
    ref = ref["out"] if isinstance(ref, dict) else ref
    ref = (torch.sigmoid(ref) if ref.shape[1] == 1 else F.softmax(ref, dim=1)).numpy()
    if ref.ndim == 4:
        ref = ref.transpose(0, 2, 3, 1)
    with h5py.File(out, "r") as f:
        got = np.asarray(f["predictions"], dtype=np.float64)
    ok = got.shape == ref.shape and bool((np.abs(got - ref) <= atol + rtol * np.abs(ref)).all())
    worst = float(np.abs(got - ref).max()) if got.shape == ref.shape else float("nan")
    check(f"{tag}: predictions equal torch eval in float64 (largest difference {worst:.2g})", ok,
          f"shapes {got.shape} {ref.shape}")
