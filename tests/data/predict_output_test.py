#!/usr/bin/python3
"""`predict --output DIR/` (SPEC section 13): one tiled, compressed BigTIFF per input image.

Each output is checked against `predict --output FILE.h5` of the same checkpoint and input,
which the section 8 oracle checks against PyTorch:

- a fully convolutional model with two output channels on grid 2x2 and under
  mpirun -np 4: NAME.tif holds round(p * 255) as uint8 and NAME-float32.tif (--float32)
  the .h5's float32 probabilities exactly; the files are BigTIFF, tiled and deflate-
  compressed; outputs of 600 x 520 images cross many 256 x 256 TIFF tiles and every
  rank's tile; images of a manifest padded by data.fit: pad are cropped back to their own
  size (one of them so small that three ranks send only its padding), named after their
  file (subfolders kept);
- an HDF5 input's outputs are named INPUT-<index>.tif;
- a classifier writes DIR/scores.csv, equal to the .h5's probabilities;
- bad output: two images that would write the same name (also through --float32's
  NAME-float32.tif), an output that is a file, --float32 with an .h5: exit 1, one message,
  nothing published.

usage: predict_output_test.py HALOTRAIN MPIRUN WORKDIR
"""
import csv
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import PIL.Image
import tifffile

BIN, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
RESULTS = []
H, W = 600, 520


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def path(*names):
    return os.path.join(WORK, *names)


def config(tag, layers, train, loss, **data):
    cfg = dict(
        name=tag, run_dir=path("runs", tag), seed=3,
        data=dict(train=train, targets="labels", scale=1.0 / 255, **data),
        model=dict(input=[H, W, 1], loss=loss, layers=layers),
        training=dict(batch_size=2, steps=1, optimizer=dict(type="adam", lr=0.05)),
        parallel=dict(backend="cpu", grid=[2, 2], device_memory="2GiB"),
        checkpoint=dict(every_steps=0, resume="never"),
    )
    p = path(f"{tag}.yaml")
    with open(p, "w") as f:
        json.dump(cfg, f)
    return p


def run(args, mpi=0):
    if mpi:
        args = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(mpi), "-x", "OMP_NUM_THREADS=1"] + args
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


def predict(cfg, ckpt, source, out, *extra, mpi=0):
    return run([BIN, "predict", cfg, "--checkpoint", ckpt, "--input", source, "--output", out, *extra], mpi)


def as_uint8(p):
    """lround(p * 255) in float32, as the writer does (half away from zero)."""
    return np.floor((p.astype(np.float32) * np.float32(255)).astype(np.float64) + 0.5).astype(np.uint8)


def tiff_problem(file, want):
    """'' when `file` is a tiled, deflate-compressed BigTIFF holding exactly `want`."""
    if not os.path.exists(file):
        return f"{file} was not written"
    with tifffile.TiffFile(file) as t:
        page = t.pages[0]
        got = page.asarray()
        if not t.is_bigtiff or not page.is_tiled or page.compression != 8:
            return f"{file}: bigtiff {t.is_bigtiff}, tiled {page.is_tiled}, compression {page.compression}"
    got = got.reshape(want.shape) if got.size == want.size else got
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{file}: {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if not np.array_equal(got, want):
        return f"{file}: {int((got != want).sum())} values differ"
    return ""


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(path("images", "sub"))
    rng = np.random.default_rng(29)

    # Images of three sizes in a manifest (data.fit: pad), one in a subfolder; their masks.
    # d.png lies in rank 0's shard alone: the other ranks send only padding for it, after
    # rank 0 has written it whole.
    sizes = [(H, W), (H - 77, W - 131), (H - 5, W), (250, 250)]
    names = ["images/a.png", "images/sub/b.png", "images/c.tif", "images/d.png"]
    rows = []
    for i, ((h, w), name) in enumerate(zip(sizes, names)):
        a = rng.integers(0, 256, (h, w)).astype(np.uint8)
        (PIL.Image.fromarray(a).save if name.endswith(".png") else lambda p: tifffile.imwrite(p, a, tile=(64, 64)))(
            path(name))
        m = np.zeros((h, w), np.uint8)
        m[: h // 2] = 1
        PIL.Image.fromarray(m).save(path(f"mask{i}.png"))
        rows.append((name, f"mask{i}.png"))
    # Two output channels (a softmax); the 0/1 PNGs are class maps.
    with open(path("seg.csv"), "w") as f:
        f.write("image,class_map\n" + "".join(f"{a},{b}\n" for a, b in rows))

    seg = [dict(type="conv2d", filters=4, kernel=3, padding="same"), dict(type="relu"),
           dict(type="conv2d", filters=2, kernel=3, padding="same")]
    cfg = config("seg", seg, path("seg.csv"), "softmax_cross_entropy", fit="pad", pad_value=0)
    r = run([BIN, "train", cfg])
    ckpt = path("runs", "seg", "checkpoints", "ckpt-1.h5")
    check("the segmentation model trains one step from the padded manifest", r.returncode == 0, r.stderr[-1500:])

    r = predict(cfg, ckpt, path("seg.csv"), path("seg.h5"))
    check("predict --output FILE.h5", r.returncode == 0, r.stderr[-1500:])
    reference = np.asarray(h5py.File(path("seg.h5"), "r")["predictions"]) if r.returncode == 0 else None
    for mpi, out in ((0, path("out") + "/"), (4, path("out-mpi") + "/")):
        r = predict(cfg, ckpt, path("seg.csv"), out, "--float32", mpi=mpi)
        problems = [] if r.returncode == 0 and reference is not None else [r.stderr[-1500:]]
        for i, ((h, w), name) in enumerate(zip(sizes, names)):
            if problems:
                break
            own = reference[i, :h, :w, :]  # cropped back to the image's own size
            stem = os.path.join(out, os.path.splitext(name)[0])
            problems += [p for p in (tiff_problem(stem + "-float32.tif", own), tiff_problem(stem + ".tif", as_uint8(own)))
                         if p]
        leftovers = [f for _, _, fs in os.walk(out) for f in fs if ".tmp" in f]
        check(f"predict --output DIR/ --float32{' under mpirun -np 4' if mpi else ' on grid 2x2'}: a BigTIFF per "
              "image named after it, cropped to its own size, uint8 = round(255 p), float32 = the .h5",
              not problems and not leftovers, (problems + leftovers)[:4])

    # An HDF5 input: INPUT-<index>.tif.
    with h5py.File(path("plain.h5"), "w") as f:
        f["images"] = rng.integers(0, 256, (2, H, W, 1)).astype(np.uint8)
    r1 = predict(cfg, ckpt, path("plain.h5"), path("plain-pred.h5"))
    r2 = predict(cfg, ckpt, path("plain.h5"), path("plain-out") + "/")
    ok = r1.returncode == 0 and r2.returncode == 0
    problems = []
    if ok:
        ref = np.asarray(h5py.File(path("plain-pred.h5"), "r")["predictions"])
        problems = [p for i in range(2) if (p := tiff_problem(path("plain-out", f"plain-{i}.tif"), as_uint8(ref[i])))]
    check("an HDF5 input's outputs are INPUT-<index>.tif, whole", ok and not problems,
          (r1.stderr + r2.stderr)[-1500:] + str(problems))

    # A classifier: DIR/scores.csv.
    labels = [dict(type="conv2d", filters=4, kernel=3, stride=2), dict(type="relu"), dict(type="global_avg_pool"),
              dict(type="dense", units=3)]
    with open(path("cls.csv"), "w") as f:
        f.write("image,label\n" + "".join(f"{n},{i % 3}\n" for i, n in enumerate(names)))
    ccfg = config("cls", labels, path("cls.csv"), "softmax_cross_entropy", fit="pad", pad_value=0)
    r = run([BIN, "train", ccfg])
    cckpt = path("runs", "cls", "checkpoints", "ckpt-1.h5")
    r1 = predict(ccfg, cckpt, path("cls.csv"), path("cls.h5"))
    r2 = predict(ccfg, cckpt, path("cls.csv"), path("cls-out") + "/")
    ok = r.returncode == 0 and r1.returncode == 0 and r2.returncode == 0
    detail = (r.stderr + r1.stderr + r2.stderr)[-1500:]
    if ok:
        ref = np.asarray(h5py.File(path("cls.h5"), "r")["predictions"])
        with open(path("cls-out", "scores.csv")) as f:
            table = list(csv.reader(f))
        got = np.array([[np.float32(v) for v in row[1:]] for row in table[1:]], np.float32)
        ok = table[0] == ["image", "class_0", "class_1", "class_2"] and [row[0] for row in table[1:]] == names \
            and np.array_equal(got, ref)
        detail = table[:4]
    check("a classifier writes DIR/scores.csv: image, class_0..2, equal to the .h5's probabilities", ok, detail)

    # Bad output.
    PIL.Image.fromarray(np.zeros((H, W), np.uint8)).save(path("images", "a.tif"))
    with open(path("clash.csv"), "w") as f:
        f.write("image\nimages/a.png\nimages/a.tif\n")
    r = predict(cfg, ckpt, path("clash.csv"), path("clash-out") + "/")
    check("two images that would write the same file: exit 1, named, nothing written",
          r.returncode == 1 and "would both write images/a.tif" in r.stderr and "images/a.png" in r.stderr
          and not [f for _, _, fs in os.walk(path("clash-out")) for f in fs], r.stderr[-800:])
    with open(path("a-file"), "w") as f:
        f.write("x")
    r = predict(cfg, ckpt, path("seg.csv"), path("a-file") + "/")
    check("an --output DIR/ that is a file: exit 1 naming it", r.returncode == 1 and "a-file" in r.stderr,
          r.stderr[-800:])
    r = predict(cfg, ckpt, path("seg.csv"), path("f32.h5"), "--float32")
    check("--float32 with an .h5 output: exit 1, nothing written",
          r.returncode == 1 and "--float32" in r.stderr and not os.path.exists(path("f32.h5")), r.stderr[-800:])
    with open(path("clash32.csv"), "w") as f:
        f.write("image\nimages/a.png\nimages/a-float32.png\n")
    PIL.Image.fromarray(np.zeros((H, W), np.uint8)).save(path("images", "a-float32.png"))
    r = predict(cfg, ckpt, path("clash32.csv"), path("clash32-out") + "/", "--float32")
    check("an image named like another's float32 file, with --float32: refused",
          r.returncode == 1 and "would both write images/a-float32.tif" in r.stderr, r.stderr[-800:])


if __name__ == "__main__":
    main()
    print(f"{RESULTS.count(False)} failed" if False in RESULTS else "all passed")
    sys.exit(0 if RESULTS and all(RESULTS) else 1)
