"""Comparing halotrain checkpoints bit for bit, for the test scripts (needs h5py)."""
import h5py
import numpy as np


def contents(path):
    """Every dataset and attribute of a checkpoint but its checksum and config text, by name."""
    out = {}
    with h5py.File(path, "r") as f:
        def attrs(name, obj):
            for k, v in obj.attrs.items():
                if "checksum" not in k and "config" not in k:
                    out[f"{name}@{k}"] = np.asarray(v)
        attrs("/", f)

        def visit(name, obj):
            if "checksum" in name or "config" in name:
                return
            if isinstance(obj, h5py.Dataset):
                out[name] = np.asarray(obj[()])
            attrs(name, obj)
        f.visititems(visit)
    return out


def differences(a_path, b_path):
    """One line per dataset or attribute that is not bit-identical; [] when none."""
    a, b = contents(a_path), contents(b_path)
    out = [f"only in one checkpoint: {n}" for n in sorted(a.keys() ^ b.keys())]
    for n in sorted(a.keys() & b.keys()):
        x, y = a[n], b[n]
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y):
            detail = ""
            if x.shape == y.shape and x.dtype.kind == "f" and y.dtype.kind == "f":
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                detail = f", max |diff| {d.max():.3g} at {list(np.unravel_index(np.argmax(d), d.shape))}"
            out.append(f"{n}: differs ({x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}{detail})")
    return out
