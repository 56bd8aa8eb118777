#!/usr/bin/python3
"""Bad input to validation, evaluate and predict (SPEC section 8), through the real binary:
each gives exit 1 with one message naming what is wrong, and nothing that looks like output.
And a predict killed with SIGKILL mid-write leaves no OUT.h5 (only its temporary), and the
next predict writes a complete one.

usage: section8_input_test.py HALOTRAIN WORKDIR
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from configs import write_config  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def halotrain(*args, timeout=300):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=WORK)
    return r.returncode, r.stdout + r.stderr


def one_error(name, code, out, *needles):
    errors = [l for l in out.splitlines() if " error " in l]
    ok = code == 1 and len(errors) == 1 and all(n in errors[0] for n in needles) and "Traceback" not in out
    check(f"{name}: exit 1, one message naming {', '.join(needles)}", ok, f"exit {code}: {out[-600:]}")


def base(tag, h=24, w=20, classes=2, **extra):
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, "runs", tag), seed=5,
        data=dict(train=os.path.join(WORK, f"train-{h}x{w}.h5"),
                  synthesize=dict(count=8, height=h, width=w, channels=1, classes=classes)),
        model=dict(input=[h, w, 1], layers=[dict(type="conv2d", filters=3, kernel=3, padding="same"),
                                            dict(type="relu"), dict(type="global_avg_pool"),
                                            dict(type="dense", units=classes)]),
        training=dict(batch_size=2, steps=2, optimizer=dict(type="adam", lr=0.01)),
        parallel=dict(backend="cpu", grid=[2, 1], device_memory="1GiB"),
        checkpoint=dict(every_steps=0, keep=2, resume="never"),
    )
    return write_config(WORK, tag, cfg, extra)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    code, out = halotrain("make-data", os.path.join(WORK, "other-32x20.h5"), "--count", "4", "--height", "32",
                          "--width", "20", "--classes", "2")
    assert code == 0, out

    cfg = base("validation_shape", **{"data.validation": os.path.join(WORK, "other-32x20.h5")})
    code, out = halotrain("train", cfg)
    one_error("a validation file of other shapes", code, out, "other-32x20.h5", "model.input")
    check("  ... and no checkpoint written", not os.path.exists(os.path.join(WORK, "runs", "validation_shape",
                                                                               "checkpoints", "ckpt-2.h5")))

    code, out = halotrain("train", base("bad_metric", **{"training.metrics": ["acuracy"]}))
    one_error("an unknown metric", code, out, "training.metrics", "did you mean 'accuracy'?")
    code, out = halotrain("train", base("auc3", classes=3, **{"training.metrics": ["auc"]}))
    one_error("auc with 3 classes", code, out, "auc needs two classes", "3 classes")
    code, out = halotrain("plan", base("auc3", classes=3, **{"training.metrics": ["auc"]}))
    one_error("auc with 3 classes (plan)", code, out, "auc needs two classes")

    code, out = halotrain("train", base("crop", **{"data.augment": {"crop": [24, 20]},
                                                   "data.train": os.path.join(WORK, "small.h5"),
                                                   "data.synthesize": dict(count=4, height=20, width=20,
                                                                           channels=1, classes=2)}))
    one_error("a crop larger than the image", code, out, "small.h5", "data.augment.crop [24, 20] is larger")
    code, out = halotrain("train", base("downsample", **{"data.downsample": 3,
                                                         "data.train": os.path.join(WORK, "other-32x20.h5")}))
    one_error("a downsample that does not divide the image", code, out, "data.downsample 3 does not divide",
              "32x20")

    # A trained model, then evaluate and predict with wrong checkpoints and files.
    good = base("good")
    code, out = halotrain("train", good)
    assert code == 0, out
    ckpt = os.path.join(WORK, "runs", "good", "checkpoints", "ckpt-2.h5")
    code, out = halotrain("train", base("other_model", **{"model.layers": [
        dict(type="conv2d", filters=5, kernel=3, padding="same"), dict(type="global_avg_pool"),
        dict(type="dense", units=2)]}))
    assert code == 0, out
    other = os.path.join(WORK, "runs", "other_model", "checkpoints", "ckpt-2.h5")
    out_h5 = os.path.join(WORK, "pred.h5")
    code, out = halotrain("predict", good, "--checkpoint", other, "--input", os.path.join(WORK, "train-24x20.h5"),
                          "--output", out_h5)
    one_error("predict with a checkpoint of another model", code, out, "ckpt-2.h5", "another model")
    check("  ... and no output file", not os.path.exists(out_h5))
    code, out = halotrain("predict", good, "--checkpoint", ckpt, "--input", os.path.join(WORK, "other-32x20.h5"),
                          "--output", out_h5)
    one_error("predict on images of another size", code, out, "other-32x20.h5", "model.input")
    check("  ... and no output file", not os.path.exists(out_h5))
    code, out = halotrain("predict", good, "--checkpoint", ckpt, "--input", os.path.join(WORK, "train-24x20.h5"),
                          "--output", os.path.join(WORK, "no-such-dir", "p.h5"))
    one_error("predict into a directory that does not exist", code, out, "--output", "no-such-dir")
    code, out = halotrain("evaluate", base("never_trained"))
    one_error("evaluate without data.validation", code, out, "data.validation or pass --data")
    code, out = halotrain("evaluate", base("never_trained"), "--data", os.path.join(WORK, "train-24x20.h5"))
    one_error("evaluate with no checkpoint in run_dir", code, out, "no valid checkpoint")

    # SIGKILL mid-write: a fully convolutional model over 32 images of 1024 x 1024.
    seg = write_config(WORK, "seg", dict(
        name="seg", run_dir=os.path.join(WORK, "runs", "seg"), seed=5,
        data=dict(train=os.path.join(WORK, "seg.h5"), targets="masks",
                  synthesize=dict(count=32, height=1024, width=1024, channels=1, masks=True)),
        model=dict(input=[1024, 1024, 1], loss="sigmoid_bce",
                   layers=[dict(type="conv2d", filters=8, kernel=3, padding="same"), dict(type="relu"),
                           dict(type="conv2d", filters=1, kernel=3, padding="same")]),
        training=dict(batch_size=2, steps=1, optimizer=dict(type="sgd", lr=0.01)),
        parallel=dict(backend="cpu", grid=[2, 1], device_memory="2GiB"),
        checkpoint=dict(every_steps=0, keep=2, resume="never")), {})
    code, out = halotrain("train", seg)
    assert code == 0, out
    seg_ckpt = os.path.join(WORK, "runs", "seg", "checkpoints", "ckpt-1.h5")
    target = os.path.join(WORK, "seg-pred.h5")
    proc = subprocess.Popen([BIN, "predict", seg, "--checkpoint", seg_ckpt, "--input", os.path.join(WORK, "seg.h5"),
                             "--output", target], cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    temp = f"{target}.tmp-{proc.pid}"
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists(temp) and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.2)  # some bands written
    killed_mid_write = proc.poll() is None and os.path.exists(temp)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    check("predict was killed while writing", killed_mid_write, "it had finished already: make the input larger")
    check("SIGKILL mid-write: no OUT.h5 that looks complete", not os.path.exists(target),
          f"{target} exists after a kill")
    code, out = halotrain("predict", seg, "--checkpoint", seg_ckpt, "--input", os.path.join(WORK, "seg.h5"),
                          "--output", target)
    with h5py.File(target, "r") as f:
        p = np.asarray(f["predictions"])
    check("the next predict writes all of OUT.h5", code == 0 and p.shape == (32, 1024, 1024, 1) and
          float(p.min()) > 0 and float(p.max()) < 1, f"exit {code}, shape {p.shape}: {out[-400:]}")

    print(f"{sum(RESULTS)}/{len(RESULTS)} checks passed")
    sys.exit(0 if all(RESULTS) else 1)


if __name__ == "__main__":
    main()
