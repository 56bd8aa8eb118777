#!/usr/bin/python3
"""`halotrain import` of Keras 2 models (SPEC section 9), end to end.

The test writes Keras 2 model files itself with h5py, in the layout Keras 2.1's
model.save() uses (root attributes keras_version, backend and model_config, the weights
under /model_weights), and model.to_json() text, covering every supported layer class in a
Sequential and a functional model. For each it checks:

- `halotrain import` exits 0 and writes a config that `halotrain plan` accepts at once;
- weights round-trip: import -> init_weights -> a checkpoint after one step at lr 1e-30
  -> every trainable weight equal to the file's;
- `halotrain predict` from that checkpoint equals a float64 PyTorch forward built here,
  independently, from the same JSON and the checkpoint's weights (SPEC tolerance);
- every unsupported layer, attribute or graph shape exits 1 with a message naming the
  layer, its class and the attribute, and listing the supported classes.

usage: keras_import_test.py HALOTRAIN WORKDIR
"""
import copy
import json
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_torch import KerasTorch, write_model_save  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
FAILED = []
ATOL, RTOL = 1e-5, 1e-4


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


# ---- Keras 2 models as JSON (what model.to_json() writes) -------------------------------
def L(cls, name, inbound=None, **config):
    config["name"] = name
    layer = {"class_name": cls, "name": name, "config": config}
    if inbound is not None:
        layer["inbound_nodes"] = [[[i, 0, 0, {}] for i in inbound]] if inbound else []
    return layer


H, W, C = 24, 20, 2
SEQUENTIAL = {"class_name": "Sequential", "keras_version": "2.1.6", "backend": "tensorflow", "config": [
    L("Conv2D", "conv_a", filters=4, kernel_size=[3, 3], strides=[1, 1], padding="same", dilation_rate=[1, 1],
      activation="relu", use_bias=True, batch_input_shape=[None, H, W, C], data_format="channels_last"),
    L("BatchNormalization", "bn", axis=-1, momentum=0.9, epsilon=1e-3, center=False, scale=True),
    L("MaxPooling2D", "pool", pool_size=[2, 2], strides=[2, 2], padding="valid", data_format="channels_last"),
    L("DepthwiseConv2D", "dw", kernel_size=[3, 3], strides=[1, 1], padding="same", depth_multiplier=2,
      dilation_rate=[1, 1], use_bias=True, activation="linear"),
    L("SeparableConv2D", "sep", filters=5, kernel_size=[3, 3], strides=[2, 2], padding="same", depth_multiplier=1,
      dilation_rate=[1, 1], use_bias=False, activation="tanh"),
    L("Dropout", "drop", rate=0.25, noise_shape=None),
    L("AveragePooling2D", "avg", pool_size=[3, 3], strides=[1, 1], padding="same"),
    L("LeakyReLU", "leaky", alpha=0.2),
    L("Activation", "act_sig", activation="sigmoid"),
    L("GlobalAveragePooling2D", "gap"),
    L("Dense", "fc", units=3, activation="softmax", use_bias=True),
]}

FUNCTIONAL = {"class_name": "Model", "keras_version": "2.1.6", "backend": "tensorflow", "config": {
    "name": "unet", "input_layers": [["image", 0, 0]], "output_layers": [["out", 0, 0]], "layers": [
        L("InputLayer", "image", [], batch_input_shape=[None, H, W, C], dtype="float32"),
        L("Conv2D", "e1", ["image"], filters=4, kernel_size=[3, 3], strides=[1, 1], padding="same",
          dilation_rate=[1, 1], activation="linear", use_bias=True),
        L("ReLU", "e1_relu", ["e1"], max_value=None, negative_slope=0.0, threshold=0.0),
        L("MaxPooling2D", "down", ["e1_relu"], pool_size=[2, 2], strides=[2, 2], padding="valid"),
        L("Conv2D", "mid", ["down"], filters=4, kernel_size=[3, 3], strides=[1, 1], padding="same",
          dilation_rate=[2, 2], activation="relu", use_bias=True),
        L("UpSampling2D", "up", ["mid"], size=[2, 2], interpolation="bilinear"),
        L("Conv2DTranspose", "tr", ["down"], filters=4, kernel_size=[3, 3], strides=[2, 2], padding="same",
          output_padding=None, dilation_rate=[1, 1], activation="linear", use_bias=True),
        L("Add", "sum", ["up", "tr", "e1_relu"]),
        L("ZeroPadding2D", "pad", ["sum"], padding=[[1, 2], [2, 1]]),
        L("Cropping2D", "crop", ["pad"], cropping=[[2, 1], [1, 2]]),
        L("Concatenate", "cat", ["crop", "image"], axis=-1),
        L("Conv2D", "out", ["cat"], filters=1, kernel_size=[1, 1], strides=[1, 1], padding="valid",
          dilation_rate=[1, 1], activation="sigmoid", use_bias=True),
    ]}}

# JSON only (no weights): a Flatten of a 1x1 map and a GlobalMaxPooling2D branch.
FLATTEN = {"class_name": "Model", "keras_version": "2.2.4", "backend": "tensorflow", "config": {
    "name": "flat", "input_layers": [["x", 0, 0]], "output_layers": [["logits", 0, 0]], "layers": [
        L("InputLayer", "x", [], batch_input_shape=[None, 8, 8, 1]),
        L("Conv2D", "c", ["x"], filters=3, kernel_size=[8, 8], strides=[1, 1], padding="valid",
          dilation_rate=[1, 1], activation="relu", use_bias=True),
        L("Flatten", "flat", ["c"]),
        L("Dense", "logits", ["flat"], units=2, activation="linear", use_bias=True),
    ]}}


def layer_list(model):
    c = model["config"]
    return c if isinstance(c, list) else c["layers"]


# ---- weights in Keras layout, and the model.save() file ---------------------------------
def keras_weights(model, rng):
    """Per layer, [(weight name, array)] in Keras layout, following the shapes through."""
    layers = layer_list(model)
    seq = model["class_name"] == "Sequential"
    chans, weights = {}, {}
    prev = None
    for l in layers:
        c, name, cls = l["config"], l["config"]["name"], l["class_name"]
        if cls == "InputLayer":
            chans[name] = c["batch_input_shape"][3]
            prev = name
            continue
        ins = [prev] if seq else [i[0] for i in l["inbound_nodes"][0]]
        if seq and prev is None:
            ins = ["__input__"]
            chans["__input__"] = c["batch_input_shape"][3]
        cin = chans[ins[0]]
        w = []
        k = c.get("kernel_size", [1, 1])[0]
        if cls == "Conv2D":
            w = [("kernel:0", rng.uniform(-1, 1, (k, k, cin, c["filters"])) / math.sqrt(k * k * cin))]
            cout = c["filters"]
        elif cls == "Conv2DTranspose":
            w = [("kernel:0", rng.uniform(-1, 1, (k, k, c["filters"], cin)) / math.sqrt(k * k * cin))]
            cout = c["filters"]
        elif cls == "DepthwiseConv2D":
            m = c["depth_multiplier"]
            w = [("depthwise_kernel:0", rng.uniform(-1, 1, (k, k, cin, m)) / k)]
            cout = cin * m
        elif cls == "SeparableConv2D":
            m = c["depth_multiplier"]
            w = [("depthwise_kernel:0", rng.uniform(-1, 1, (k, k, cin, m)) / k),
                 ("pointwise_kernel:0", rng.uniform(-1, 1, (1, 1, cin * m, c["filters"])) / math.sqrt(cin * m))]
            cout = c["filters"]
        elif cls == "BatchNormalization":
            w = [("gamma:0", rng.uniform(0.5, 1.5, cin)), ("beta:0", rng.uniform(-0.2, 0.2, cin)),
                 ("moving_mean:0", rng.uniform(-0.1, 0.1, cin)), ("moving_variance:0", rng.uniform(0.5, 1.5, cin))]
            w = [(k, v) for k, v in w if (k != "gamma:0" or c.get("scale", True)) and (k != "beta:0" or c.get("center", True))]
            cout = cin
        elif cls == "Dense":
            w = [("kernel:0", rng.uniform(-1, 1, (cin, c["units"])) / math.sqrt(cin))]
            cout = c["units"]
        elif cls == "Concatenate":
            cout = sum(chans[i] for i in ins)
        else:
            cout = cin
        if c.get("use_bias", False) and cls in ("Conv2D", "Conv2DTranspose", "DepthwiseConv2D", "SeparableConv2D",
                                                 "Dense"):
            w.append(("bias:0", rng.uniform(-0.1, 0.1, cout)))
        weights[name] = [(n, np.asarray(v, dtype=np.float32)) for n, v in w]
        chans[name] = cout
        prev = name
    return weights


def torch_forward(model, ckpt, x):
    """The Keras model's inference forward in float64 (NCHW) with a checkpoint's weights, by
    tests/import/keras_torch.py's independent reading of the same JSON; its final softmax
    or sigmoid applied."""
    weights = {n: [(w, np.asarray(ckpt[n][n][w])) for w in ckpt[n][n]]
               for n in (l["config"]["name"] for l in layer_list(model)) if n in ckpt and n in ckpt[n]}
    with torch.no_grad():
        y = KerasTorch(model, weights).forward(x, training=False)
    return {"softmax": torch.softmax(y, dim=1), "sigmoid": torch.sigmoid(y)}.get(model_final(model), y)


def trainable(path):
    out = {}
    with h5py.File(path, "r") as f:
        for n in f.attrs["layer_names"]:
            n = n.decode()
            for w in f[n].attrs.get("weight_names", []):
                w = w.decode()
                if "moving" not in w:
                    out[f"{n}/{w.split('/')[-1]}"] = np.asarray(f[n][w])
    return out


def end_to_end(tag, model, targets):
    work = os.path.join(WORK, tag)
    os.makedirs(work)
    src = os.path.join(work, f"{tag}.h5")
    write_model_save(src, model, keras_weights(model, np.random.default_rng(3)))
    r = run("import", src)
    cfg, init = os.path.join(work, f"{tag}.yaml"), os.path.join(work, f"{tag}-init.h5")
    check(f"{tag}: import exits 0 and writes the config and the weights",
          r.returncode == 0 and os.path.exists(cfg) and os.path.exists(init), r.stdout + r.stderr)
    if r.returncode != 0:
        return
    r = run("plan", cfg)
    check(f"{tag}: plan accepts the imported config at once", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
    sets = ["training.steps=1", "training.batch_size=2", "training.optimizer.lr=1e-30", "parallel.grid=[2,1]", "checkpoint.every_steps=1",
            "parallel.device_memory=1GiB", f"run_dir={os.path.join(work, 'run')}",
            f"data.train={os.path.join(work, 'data.h5')}"]
    r = subprocess.run([BIN, "train", cfg] + [a for s in sets for a in ("--set", s)], capture_output=True,
                       text=True, timeout=300, cwd=work)
    ck = os.path.join(work, "run", "checkpoints", "ckpt-1.h5")
    check(f"{tag}: trains one step from the imported weights", r.returncode == 0 and os.path.exists(ck),
          r.stderr[-3000:])
    if r.returncode != 0:
        return
    a, b = trainable(init), trainable(ck)
    same = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    check(f"{tag}: import -> init_weights -> checkpoint: every trainable weight equal ({len(a)} tensors)", same,
          f"{sorted(a.keys() ^ b.keys())}")
    # predict from the checkpoint == PyTorch from the same JSON and the checkpoint's weights
    images = np.random.default_rng(4).uniform(0, 1, (3, H if tag != "flat" else 8, W if tag != "flat" else 8,
                                                     model_channels(model))).astype(np.float32)
    inp, outp = os.path.join(work, "in.h5"), os.path.join(work, "pred.h5")
    with h5py.File(inp, "w") as f:
        f.create_dataset("images", data=images)
    r = subprocess.run([BIN, "predict", cfg, "--checkpoint", ck, "--input", inp, "--output", outp] +
                       [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=300, cwd=work)
    check(f"{tag}: predict runs", r.returncode == 0, r.stderr[-3000:])
    if r.returncode != 0:
        return
    with h5py.File(ck, "r") as f, h5py.File(outp, "r") as p:
        ref = torch_forward(model, f, torch.tensor(images, dtype=torch.float64).permute(0, 3, 1, 2))
        got = np.asarray(p["predictions"], dtype=np.float64)
    # predict writes probabilities channels-last: the model's final softmax or sigmoid,
    # which the import folded into the loss.
    ref = ref.numpy() if targets == "labels" else ref.permute(0, 2, 3, 1).numpy()
    err = np.abs(got - ref) - (ATOL + RTOL * np.abs(ref))
    check(f"{tag}: predict == the PyTorch forward of the same JSON (worst {np.abs(got - ref).max():.3g})",
          got.shape == ref.shape and (err <= 0).all(), f"shapes {got.shape} vs {ref.shape}")


def model_channels(model):
    for l in layer_list(model):
        if "batch_input_shape" in l["config"]:
            return l["config"]["batch_input_shape"][3]


def model_final(model):
    return layer_list(model)[-1]["config"].get("activation", "linear")


def import_error(tag, model):
    path = os.path.join(WORK, "bad", f"{tag}.json")
    with open(path, "w") as f:
        json.dump(model, f)
    r = run("import", path, "-o", os.path.join(WORK, "bad", f"{tag}.yaml"))
    return r.returncode, r.stdout + r.stderr


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "bad"))
    end_to_end("sequential", SEQUENTIAL, "labels")
    end_to_end("unet", FUNCTIONAL, "masks")

    # JSON only: no weights file; plan works; the Flatten of a 1x1 map is imported.
    path = os.path.join(WORK, "flat.json")
    with open(path, "w") as f:
        json.dump(FLATTEN, f)
    r = run("import", path)
    cfg = os.path.join(WORK, "flat.yaml")
    check("json: import of model.to_json() text exits 0, no weights file",
          r.returncode == 0 and os.path.exists(cfg) and not os.path.exists(os.path.join(WORK, "flat-init.h5")),
          r.stdout + r.stderr)
    check("json: the missing final activation is reported", "model.loss mse" in r.stdout, r.stdout)
    r = run("plan", cfg)
    check("json: plan accepts it", r.returncode == 0, r.stderr[-1000:])

    # A layer the Keras model froze stays frozen (SPEC section 14).
    frozen = copy.deepcopy(FUNCTIONAL)
    frozen["config"]["layers"][1]["config"]["trainable"] = False
    path = os.path.join(WORK, "frozen.json")
    with open(path, "w") as f:
        json.dump(frozen, f)
    r = run("import", path)
    text = open(os.path.join(WORK, "frozen.yaml")).read() if r.returncode == 0 else ""
    line = [t for t in text.splitlines() if 'name: "e1"' in t]
    others = [t for t in text.splitlines() if "trainable" in t and 'name: "e1"' not in t]
    check("json: Keras's trainable false is kept on that layer alone",
          r.returncode == 0 and len(line) == 1 and "trainable: false" in line[0] and not others, text[-1500:])

    # Every unsupported class of thing: exit 1 naming layer, class and attribute.
    supported = "halotrain imports Activation, Add"
    def variant(edit):
        m = copy.deepcopy(FUNCTIONAL)
        edit(m["config"]["layers"])
        return m
    def set_cfg(i, **kv):
        return lambda ls: ls[i]["config"].update(kv)
    cases = [
        ("unknown class", variant(lambda ls: ls[2].update(class_name="LSTM")), "LSTM 'e1_relu' is not a layer halotrain has"),
        ("kernel size", variant(set_cfg(1, kernel_size=[3, 0])), "Conv2D 'e1' kernel_size [3,0] (two integers >= 1)"),
        ("activation", variant(set_cfg(4, activation="elu")), "Conv2D 'mid' activation 'elu'"),
        ("softmax inside", variant(set_cfg(4, activation="softmax")), "activation 'softmax' before the output"),
        ("channels_first", variant(set_cfg(3, data_format="channels_first")), "MaxPooling2D 'down' data_format channels_first"),
        ("padding", variant(set_cfg(1, padding="causal")), "Conv2D 'e1' padding 'causal'"),
        ("output_padding", variant(set_cfg(6, output_padding=[1, 1])), "Conv2DTranspose 'tr' output_padding [1,1]"),
        ("interpolation", variant(set_cfg(5, interpolation="bicubic")), "UpSampling2D 'up' interpolation 'bicubic'"),
        ("concat axis", variant(set_cfg(10, axis=1)), "Concatenate 'cat' axis 1"),
        ("relu threshold", variant(set_cfg(2, threshold=0.5)), "ReLU 'e1_relu' max_value null negative_slope 0 threshold 0.5"),
        ("shared layer", variant(lambda ls: ls[4].update(inbound_nodes=[[["down", 0, 0, {}]], [["down", 0, 0, {}]]])),
         "Conv2D 'mid' is called 2 times (a shared layer)"),
        ("no fixed size", variant(set_cfg(0, batch_input_shape=[None, None, None, 2])), "InputLayer 'image' batch_input_shape [null,null,null,2]"),
        ("shape mismatch", variant(set_cfg(8, padding=[[1, 1], [2, 1]])),
         "Concatenate 'cat' cannot be a halotrain concatenate here: concatenate joins channels of maps of one size: "
         "input 'crop' is 23x20x4 but input 'input' is 24x20x2"),
    ]
    bn = copy.deepcopy(SEQUENTIAL)
    bn["config"][1]["config"]["axis"] = 1
    cases.append(("bn axis", bn, "BatchNormalization 'bn' axis 1 (the channel axis, -1 or 3)"))
    drop = copy.deepcopy(SEQUENTIAL)
    drop["config"][5]["config"]["noise_shape"] = [None, 1, 1, 4]
    cases.append(("noise_shape", drop, "Dropout 'drop' noise_shape [null,1,1,4]"))
    flat = copy.deepcopy(FLATTEN)
    flat["config"]["layers"][2] = L("Reshape", "flat", ["c"], target_shape=[-1])
    cases.append(("reshape of a map", flat, "Reshape 'flat' target_shape [-1] of a feature map"))
    two = copy.deepcopy(FUNCTIONAL)
    two["config"]["output_layers"].append(["sum", 0, 0])
    cases.append(("two outputs", two, "the model has 2 outputs (out, sum)"))
    for name, model, want in cases:
        code, text = import_error(name.replace(" ", "_"), model)
        listed = supported in text or "does not work in halotrain" in text or "outputs" in want
        check(f"refused: {name} (exit 1, names it{', lists what is supported' if listed else ''})",
              code == 1 and want in text and listed, f"exit {code}: {text[-600:]}")

    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
