"""Config files for the tests that drive the real binary: a dict of SPEC section 3 keys,
dotted-key overrides ("training.steps": 5), written as JSON (which is YAML)."""
import json
import os


def write_config(work, tag, cfg, over):
    """Applies `over` to `cfg` (in place) and writes WORK/TAG.yaml; returns its path."""
    for k, v in over.items():
        node = cfg
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    path = os.path.join(work, tag + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path
