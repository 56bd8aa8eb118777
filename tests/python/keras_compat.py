#!/usr/bin/python3
"""Keras 2.1.6 HDF5 weights I/O, re-enacted with h5py, for keras_h5_test.

Writing follows keras/engine/topology.py of Keras 2.1.6 (save_weights_to_hdf5_group,
save_attributes_to_hdf5_group, save_model's `model_weights` group) as it ran on h5py 2.x:
byte strings become fixed-length numpy 'S' arrays. Reading follows
load_weights_from_hdf5_group. Weight values follow one formula shared with the C++ test:
    value = arange(n, float32) * float32(0.01) + float32(10 * layer_index + weight_index + 1)

usage:
  keras_compat.py save-weights OUT     # model.save_weights(OUT)
  keras_compat.py model-save OUT       # model.save(OUT): weights under /model_weights
  keras_compat.py split OUT            # so many layers that layer_names splits in parts
  keras_compat.py vlen OUT             # save-weights with h5py 3 defaults: str lists -> vlen strings
  keras_compat.py load CKPT            # load_weights + halotrain checksum, of a C++ checkpoint
Exit status 0 on success; a message on stderr otherwise.
"""
import hashlib
import json
import struct
import sys

import h5py
import numpy as np

HDF5_OBJECT_HEADER_LIMIT = 64512

# (layer name, [(weight name, shape)]): the model both sides agree on.
MODEL = [
    ("conv2d_1", [("kernel:0", (3, 3, 1, 4)), ("bias:0", (4,))]),
    ("batch_normalization_1", [("gamma:0", (4,)), ("beta:0", (4,)),
                               ("moving_mean:0", (4,)), ("moving_variance:0", (4,))]),
    ("activation_1", []),
    ("max_pooling2d_1", []),
    ("global_average_pooling2d_1", []),
    ("dense_1", [("kernel:0", (4, 2)), ("bias:0", (2,))]),
]


def value(layer_index, weight_index, shape):
    n = int(np.prod(shape))
    seed = np.float32(10 * layer_index + weight_index + 1)
    return (np.arange(n, dtype=np.float32) * np.float32(0.01) + seed).reshape(shape)


def save_attributes_to_hdf5_group(group, name, data):
    """Keras 2.1.6, verbatim but for h5py 2's list -> fixed-length 'S' array conversion."""
    bad_attributes = [x for x in data if len(x) > HDF5_OBJECT_HEADER_LIMIT]
    if bad_attributes:
        raise RuntimeError("attribute too large")
    data_npy = np.asarray(data)
    num_chunks = 1
    chunked_data = np.array_split(data_npy, num_chunks)
    while any(map(lambda x: x.nbytes > HDF5_OBJECT_HEADER_LIMIT, chunked_data)):
        num_chunks += 1
        chunked_data = np.array_split(data_npy, num_chunks)
    if num_chunks > 1:
        for chunk_id, chunk_data in enumerate(chunked_data):
            group.attrs["%s%d" % (name, chunk_id)] = chunk_data
    else:
        group.attrs[name] = data_npy


def load_attributes_from_hdf5_group(group, name):
    if name in group.attrs:
        data = [n.decode("utf8") for n in group.attrs[name]]
    else:
        data = []
        chunk_id = 0
        while ("%s%d" % (name, chunk_id)) in group.attrs:
            data.extend([n.decode("utf8") for n in group.attrs["%s%d" % (name, chunk_id)]])
            chunk_id += 1
    return data


def save_weights_to_hdf5_group(f, model):
    save_attributes_to_hdf5_group(f, "layer_names", [name.encode("utf8") for name, _ in model])
    f.attrs["backend"] = np.bytes_("tensorflow".encode("utf8"))
    f.attrs["keras_version"] = np.bytes_("2.1.6".encode("utf8"))
    for li, (layer, weights) in enumerate(model):
        g = f.create_group(layer)
        weight_names = [("%s/%s" % (layer, w)).encode("utf8") for w, _ in weights]
        save_attributes_to_hdf5_group(g, "weight_names", weight_names)
        for wi, (name, (_, shape)) in enumerate(zip(weight_names, weights)):
            val = value(li, wi, shape)
            param_dset = g.create_dataset(name, val.shape, dtype=val.dtype)
            param_dset[:] = val


def cmd_save_weights(out):
    with h5py.File(out, "w") as f:
        save_weights_to_hdf5_group(f, MODEL)


def cmd_model_save(out):
    with h5py.File(out, "w") as f:
        f.attrs["keras_version"] = np.bytes_(b"2.1.6")
        f.attrs["backend"] = np.bytes_(b"tensorflow")
        config = {"class_name": "Sequential", "config": [{"class_name": "Conv2D"}]}
        f.attrs["model_config"] = np.bytes_(json.dumps(config).encode("utf8"))
        f.attrs["training_config"] = np.bytes_(json.dumps({"loss": "mse"}).encode("utf8"))
        save_weights_to_hdf5_group(f.create_group("model_weights"), MODEL)
        opt = f.create_group("optimizer_weights")
        save_attributes_to_hdf5_group(opt, "weight_names", [b"Adam/iterations:0"])
        opt.create_dataset(b"Adam/iterations:0", data=np.int64(3))


def cmd_split(out):
    # 2000 layers x 40-byte names = 80 KB > 64512: Keras writes layer_names0, layer_names1.
    model = [("layer_with_a_rather_long_name_%010d" % i, []) for i in range(2000)]
    model += [("dense_1", [("kernel:0", (4, 2)), ("bias:0", (2,))])]
    with h5py.File(out, "w") as f:
        save_weights_to_hdf5_group(f, model)
        assert "layer_names" not in f.attrs and "layer_names1" in f.attrs


def cmd_vlen(out):
    # What newer writers produce when they hand h5py 3 plain `str` lists.
    with h5py.File(out, "w") as f:
        f.attrs["layer_names"] = [name for name, _ in MODEL]
        f.attrs["backend"] = "tensorflow"
        f.attrs["keras_version"] = "2.1.6"
        for li, (layer, weights) in enumerate(MODEL):
            g = f.create_group(layer)
            g.attrs["weight_names"] = ["%s/%s" % (layer, w) for w, _ in weights]
            for wi, (w, shape) in enumerate(weights):
                g.create_dataset("%s/%s" % (layer, w), data=value(li, wi, shape))
        assert h5py.check_string_dtype(f.attrs.get_id("layer_names").dtype).length is None


def fail(msg):
    sys.stderr.write("keras_compat.py: %s\n" % msg)
    sys.exit(1)


def cmd_load(path):
    with h5py.File(path, "r") as f:
        # load_weights_from_hdf5_group: these .decode calls fail on variable-length strings.
        if f.attrs["keras_version"].decode("utf8") != "2.1.6":
            fail("keras_version")
        if f.attrs["backend"].decode("utf8") != "tensorflow":
            fail("backend")
        layer_names = load_attributes_from_hdf5_group(f, "layer_names")
        if layer_names != [name for name, _ in MODEL]:
            fail("layer_names %r" % layer_names)
        filtered = []
        for name in layer_names:
            if load_attributes_from_hdf5_group(f[name], "weight_names"):
                filtered.append(name)
        if len(filtered) != sum(1 for _, w in MODEL if w):
            fail("layers with weights: %r" % filtered)
        hasher = hashlib.sha256()

        def hash_tensor(path, array):
            hasher.update(path.encode("utf8") + b"\0")
            hasher.update(struct.pack("<Q", array.ndim))
            for d in array.shape:
                hasher.update(struct.pack("<q", d))
            hasher.update(np.ascontiguousarray(array, dtype="<f4").tobytes())

        for li, (layer, weights) in enumerate(MODEL):
            g = f[layer]
            weight_names = load_attributes_from_hdf5_group(g, "weight_names")
            if weight_names != ["%s/%s" % (layer, w) for w, _ in weights]:
                fail("weight_names of %s: %r" % (layer, weight_names))
            weight_values = [np.asarray(g[weight_name]) for weight_name in weight_names]
            for wi, ((_, shape), val) in enumerate(zip(weights, weight_values)):
                if val.dtype != np.float32 or val.shape != shape:
                    fail("%s: %s %r" % (weight_names[wi], val.dtype, val.shape))
                if not np.array_equal(val, value(li, wi, shape)):
                    fail("%s: values differ" % weight_names[wi])
                hash_tensor("%s/%s" % (layer, weight_names[wi]), val)
        ht = f["halotrain"]
        slot_names = load_attributes_from_hdf5_group(ht, "slot_names")
        for si, name in enumerate(slot_names):
            val = np.asarray(ht["slots/" + name])
            if not np.array_equal(val, value(90 + si, 0, val.shape)):
                fail("slot %s: values differ" % name)
            hash_tensor("slots/" + name, val)
        step, epoch, cursor = (int(ht.attrs[k]) for k in ("step", "epoch", "cursor"))
        version = int(ht.attrs["format_version"])
        model_hash = ht.attrs["model_hash"]
        rng = np.asarray(ht["rng_state"], dtype=np.uint8).tobytes()
        config = ht["config_text"][()]
        hasher.update(b"halotrain\0" + struct.pack("<qqqq", step, epoch, cursor, version))
        hasher.update(model_hash + b"\0")
        hasher.update(struct.pack("<Q", len(rng)) + rng)
        hasher.update(struct.pack("<Q", len(config)) + config)
        stored = ht.attrs["checksum"].decode("utf8")
        if stored != "sha256:" + hasher.hexdigest():
            fail("checksum %s != sha256:%s" % (stored, hasher.hexdigest()))
        print("loaded %d layers, %d slots, step %d, checksum OK" % (len(layer_names), len(slot_names), step))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail(__doc__)
    {"save-weights": cmd_save_weights, "model-save": cmd_model_save, "split": cmd_split,
     "vlen": cmd_vlen, "load": cmd_load}.get(sys.argv[1], lambda _: fail("unknown command " + sys.argv[1]))(sys.argv[2])
