#!/usr/bin/python3
"""Data read in place from a CSV manifest of image files (SPEC section 13), end to end.

Files are written by Debian's python3-pil, python3-tifffile and python3-pydicom (and
gdcmconv for the compressed DICOM transfer syntaxes; python3-openslide checks the slides); the values they hold are computed
here with numpy (DICOM: MONOCHROME1 inverted on the stored bits, then the rescale) and
written to an HDF5 file too. Training from the manifest equals training from that HDF5
file bit for bit:

- gray images in every format at once (PNG 8 and 16 bit and interlaced, JPEG baseline and progressive
  (the values libjpeg gives PIL), TIFF tiled and in strips,
  compressed and not, float32 TIFF, DICOM MONOCHROME1/2 with 12 of 16 bits and a rescale,
  JPEG lossless and JPEG 2000 DICOM) on grid 2x2, and under mpirun; `plan` counts the
  files decoded whole (interlaced PNG, progressive JPEG, DICOM) and their host memory;
- whole-slide images (Aperio-style pyramids) through OpenSlide at data.level 0 and 1; a
  missing tile, transparent to OpenSlide, reads as data.pad_value;
- RGB PNG, JPEG and TIFF (interleaved tiles, and separate planes in strips), and
  JPEG-in-TIFF read as RGB; a signed 16-bit TIFF with a predictor; data.channels converting RGB
  files to gray (ITU-R 601-2 luma) and gray files to RGB;
- masks (PNG) and class maps (palette PNG) for a U-Net-like model;
- data.fit pad (with data.pad_value), crop and resize, against numpy padding, centre
  cropping and torch's area / nearest interpolation written out with numpy;
- data.scale: auto, each image's integer range to [0, 1]; data.mean and data.std;
- evaluate --data and predict --input from a manifest equal the same from the HDF5 file;
- convert-data writes the manifest as an HDF5 file (after data.fit; uint8/uint16 kept,
  float32 otherwise) that trains as the manifest does;
- a resume over an edited manifest (a file rewritten, rows added) is refused naming what
  changed; over the same one it goes on.

Bad input exits 1 with one message naming the CSV line and the file: a missing image, a
file that is no image, a corrupt PNG, a label out of range, a mask of another size than its
image, an image with other channels than model.input, sizes that differ without data.fit.

usage: manifest_test.py HALOTRAIN MPIRUN WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import PIL.Image
import pydicom
import tifffile
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

BIN, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
RESULTS = []
H, W = 40, 32


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def path(name):
    return os.path.join(WORK, name)


def write_dicom(name, stored, photometric="MONOCHROME2", bits_stored=12, slope=None, intercept=None,
                inverse_lut=False):
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.2"  # digital mammography, for presentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(path(name), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality = "MG"
    ds.Rows, ds.Columns = stored.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, bits_stored, bits_stored - 1, 0
    if slope is not None:
        ds.RescaleSlope, ds.RescaleIntercept = str(slope), str(intercept)
    if inverse_lut:
        ds.PresentationLUTShape = "INVERSE"
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.PixelData = stored.astype(np.uint16).tobytes()
    ds.save_as(path(name), write_like_original=False)


def dicom_values(stored, bits_stored, invert, slope=1.0, intercept=0.0):
    """SPEC section 13: inverted on the stored range, then rescaled."""
    v = stored.astype(np.float64)
    if invert:
        v = (2 ** bits_stored - 1) - v
    return (v * slope + intercept).astype(np.float32)


def write_interlaced_png(name, a):
    """An 8-bit gray Adam7-interlaced PNG (PIL writes none): each pass's rows, filter 0."""
    import struct
    import zlib
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)):
        sub = a[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)
    with open(path(name), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", a.shape[1], a.shape[0], 8, 0, 0, 0, 1))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def gray_images(rng):
    """(file name, the values halotrain must read) for every gray format."""
    out = []
    a8 = rng.integers(0, 256, (H, W)).astype(np.uint8)
    PIL.Image.fromarray(a8).save(path("g8.png"))
    out.append(("g8.png", a8.astype(np.float32)))
    a16 = rng.integers(0, 65536, (H, W)).astype(np.uint16)
    PIL.Image.fromarray(a16.astype(np.int32), mode="I").convert("I;16").save(path("g16.png"))
    out.append(("g16.png", np.asarray(PIL.Image.open(path("g16.png")), dtype=np.float32)))
    ai = rng.integers(0, 256, (H, W)).astype(np.uint8)
    write_interlaced_png("interlaced.png", ai)
    check("the test's interlaced PNG is Adam7 and reads back as written (PIL)",
          PIL.Image.open(path("interlaced.png")).info.get("interlace") == 1
          and np.array_equal(np.asarray(PIL.Image.open(path("interlaced.png"))), ai))
    out.append(("interlaced.png", ai.astype(np.float32)))
    for name, progressive in (("g.jpg", False), ("g-progressive.jpg", True)):
        PIL.Image.fromarray(rng.integers(0, 256, (H, W)).astype(np.uint8)).save(path(name), quality=90,
                                                                                   progressive=progressive)
        out.append((name, np.asarray(PIL.Image.open(path(name)), dtype=np.float32)))  # libjpeg's decoding, via PIL
    t16 = rng.integers(0, 65536, (H, W)).astype(np.uint16)
    tifffile.imwrite(path("tiled.tif"), t16, tile=(16, 16), compression="zlib")
    out.append(("tiled.tif", t16.astype(np.float32)))
    s8 = rng.integers(0, 256, (H, W)).astype(np.uint8)
    PIL.Image.fromarray(s8).save(path("strips.tif"), compression="tiff_lzw")  # strips, LZW (through libtiff)
    out.append(("strips.tif", s8.astype(np.float32)))
    big = rng.integers(0, 256, (H, W)).astype(np.uint8)
    tifffile.imwrite(path("big.tif"), big, bigtiff=True, tile=(16, 32))
    out.append(("big.tif", big.astype(np.float32)))
    s16 = rng.integers(-32768, 32768, (H, W)).astype(np.int16)
    tifffile.imwrite(path("signed.tif"), s16, compression="zlib", predictor=True)  # signed, with a predictor
    out.append(("signed.tif", s16.astype(np.float32)))
    f32 = rng.uniform(-1, 1, (H, W)).astype(np.float32)
    tifffile.imwrite(path("float.tif"), f32)
    out.append(("float.tif", f32))
    d1 = rng.integers(0, 4096, (H, W)).astype(np.uint16)
    write_dicom("mono1.dcm", d1, "MONOCHROME1", 12, 0.5, -3)
    out.append(("mono1.dcm", dicom_values(d1, 12, True, 0.5, -3)))
    d2 = rng.integers(0, 4096, (H, W)).astype(np.uint16)
    write_dicom("mono2-inverse.dcm", d2, "MONOCHROME2", 12, inverse_lut=True)
    out.append(("mono2-inverse.dcm", dicom_values(d2, 12, True)))
    d3 = rng.integers(0, 4096, (H, W)).astype(np.uint16)
    write_dicom("plain.dcm", d3, "MONOCHROME2", 12)
    for flag, name in (("--jpeg", "jpegll.dcm"), ("--j2k", "j2k.dcm")):
        r = subprocess.run(["gdcmconv", flag, "-i", path("plain.dcm"), "-o", path(name)], capture_output=True, text=True)
        check(f"gdcmconv {flag} writes {name}", r.returncode == 0, r.stderr)
        out.append((name, dicom_values(d3, 12, False)))
    out.append(("plain.dcm", dicom_values(d3, 12, False)))
    return out


def write_h5(name, images, targets, kind="labels"):
    with h5py.File(path(name), "w") as f:
        f.create_dataset("images", data=np.stack(images).astype(np.float32), chunks=True)
        f.create_dataset(kind, data=np.asarray(targets))


def write_csv(name, header, rows):
    with open(path(name), "w") as f:
        f.write(header + "\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


def config(tag, train, channels=1, layers=None, loss="softmax_cross_entropy", **over):
    cfg = dict(
        name=tag, run_dir=path(f"runs/{tag}"), seed=5,
        data=dict(train=path(train), targets="labels" if loss == "softmax_cross_entropy" and layers is None
                  else "masks", scale=1.0 / 4096),
        model=dict(input=[H, W, channels], loss=loss, layers=layers or [
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False), dict(type="batch_norm"),
            dict(type="relu"), dict(type="max_pool2d", pool=2), dict(type="conv2d", filters=4, kernel=3),
            dict(type="relu"), dict(type="global_avg_pool"), dict(type="dense", units=2)]),
        training=dict(batch_size=4, steps=3, optimizer=dict(type="adam", lr=0.01)),
        parallel=dict(backend="cpu", grid=[2, 2], device_memory="1GiB"),
        checkpoint=dict(every_steps=0, resume="never"),
    )
    for k, v in over.items():
        node = cfg
        *keys, last = k.split(".")
        for key in keys:
            node = node[key]
        node[last] = v
    p = path(f"{tag}.yaml")
    with open(p, "w") as f:
        json.dump(cfg, f)
    shutil.rmtree(cfg["run_dir"], ignore_errors=True)
    return p


def train(cfg, mpi=0):
    cmd = [BIN, "train", cfg]
    if mpi:
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(mpi), "-x", "OMP_NUM_THREADS=1"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def datasets(ckpt):
    out = {}
    with h5py.File(ckpt, "r") as f:
        def visit(name, obj):
            # The config and the data's identity name the files; the rest must be equal.
            if isinstance(obj, h5py.Dataset) and name not in ("halotrain/config_text", "halotrain/data_identity"):
                out[name] = np.asarray(obj)
        f.visititems(visit)
    return out


def same_training(title, csv_cfg, h5_cfg, mpi=0):
    for cfg in (csv_cfg, h5_cfg):  # run_dir is runs/<the config's name>
        shutil.rmtree(path(f"runs/{os.path.basename(cfg)[:-5]}"), ignore_errors=True)
    a, b = train(h5_cfg, mpi), train(csv_cfg, mpi)
    ok = a.returncode == 0 and b.returncode == 0
    diff = []
    if ok:
        wa = datasets(path(f"runs/{os.path.basename(h5_cfg)[:-5]}/checkpoints/ckpt-3.h5"))
        wb = datasets(path(f"runs/{os.path.basename(csv_cfg)[:-5]}/checkpoints/ckpt-3.h5"))
        diff = [n for n in wa if n not in wb or not np.array_equal(wa[n], wb[n])]
    check(title, ok and not diff, (a.stderr[-1500:] + b.stderr[-1500:]) if not ok else diff[:5])


def refused(title, cfg, *wants):
    r = train(cfg)
    check(title, r.returncode == 1 and all(w in r.stderr for w in wants), r.stderr[-1200:])


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(path("runs"))
    rng = np.random.default_rng(13)

    # 1. Every gray format in one manifest.
    gray = gray_images(rng)
    labels = [i % 2 for i in range(len(gray))]
    write_csv("gray.csv", "image,label,patient", [(n, y, f"p{i}") for i, ((n, _), y) in enumerate(zip(gray, labels))])
    write_h5("gray.h5", [v[..., None] for _, v in gray], np.array(labels, dtype=np.int32))
    same_training(f"{len(gray)} gray images (PNG, JPEG, TIFF, BigTIFF, DICOM raw, JPEG lossless, JPEG 2000) train as "
                  "their HDF5 twin on 2x2, bit for bit", config("gray_csv", "gray.csv"), config("gray_h5", "gray.h5"))
    same_training("and under mpirun -np 4", config("gray_csv_mpi", "gray.csv"), config("gray_h5_mpi", "gray.h5"), mpi=4)
    # The plan counts what cannot be streamed: the interlaced PNG, the progressive JPEG and the
    # two compressed DICOM frames are decoded whole (the uncompressed ones are read where their
    # rows lie); the largest holds a 16-bit frame's samples and floats.
    r = subprocess.run([BIN, "plan", path("gray_csv.yaml"), "--json"], capture_output=True, text=True, timeout=120)
    got = json.loads(r.stdout).get("data_files") if r.returncode == 0 else None
    check("plan counts the files decoded whole and the host memory they hold per rank",
          got == {"images": len(gray), "decoded_whole": 4, "whole_decode_bytes_per_rank": H * W * (4 + 2)},
          (got, r.stderr[-800:]))
    r = subprocess.run([BIN, "plan", path("gray_csv.yaml")], capture_output=True, text=True, timeout=120)
    check("and says so in its text", f"data: 4 of {len(gray)} image files cannot be streamed" in r.stdout
          and "jpegll.dcm" in r.stdout, r.stdout[-1500:])

    # 2. RGB.
    rgb = []
    for i in range(4):
        a = rng.integers(0, 256, (H, W, 3)).astype(np.uint8)
        name = f"rgb{i}.png" if i % 2 == 0 else f"rgb{i}.tif"
        if i % 2 == 0:
            PIL.Image.fromarray(a).save(path(name))
        else:
            # one in interleaved tiles, one in separate planes of strips
            if i == 1:
                tifffile.imwrite(path(name), a, photometric="rgb", tile=(16, 16))
            else:  # tifffile takes separate planes as [C, H, W]
                tifffile.imwrite(path(name), a.transpose(2, 0, 1), photometric="rgb", planarconfig="separate",
                                 rowsperstrip=8)
        rgb.append((name, a.astype(np.float32)))
    PIL.Image.fromarray(rng.integers(0, 256, (H, W, 3)).astype(np.uint8)).save(path("rgb.jpg"), quality=85)
    rgb.append(("rgb.jpg", np.asarray(PIL.Image.open(path("rgb.jpg")), dtype=np.float32)))
    # JPEG-in-TIFF (YCbCr), read as RGB: the values are what libtiff's decoder gives PIL.
    a = rng.integers(0, 256, (H, W, 3)).astype(np.uint8)
    PIL.Image.fromarray(a).save(path("rgb-jpeg.tif"), compression="jpeg")
    rgb.append(("rgb-jpeg.tif", np.asarray(PIL.Image.open(path("rgb-jpeg.tif")).convert("RGB"), dtype=np.float32)))
    write_csv("rgb.csv", "image,label", [(n, i % 2) for i, (n, _) in enumerate(rgb)])
    write_h5("rgb.h5", [v for _, v in rgb], np.array([i % 2 for i in range(len(rgb))], dtype=np.int32))
    same_training("RGB PNG, JPEG, TIFF and JPEG-in-TIFF train as their HDF5 twin", config("rgb_csv", "rgb.csv", channels=3),
                  config("rgb_h5", "rgb.h5", channels=3))

    # data.channels: RGB files into a gray model (ITU-R 601-2 luma), gray files into an RGB one.
    write_csv("to_gray.csv", "image,label", [(n, i % 2) for i, (n, _) in enumerate(rgb)])
    luma = [(0.299 * d[..., 0] + 0.587 * d[..., 1] + 0.114 * d[..., 2]).astype(np.float32)[..., None]
            for d in (v.astype(np.float64) for _, v in rgb)]
    write_h5("to_gray.h5", luma, np.array([i % 2 for i in range(len(rgb))], dtype=np.int32))
    same_training("data.channels: 1 makes RGB files gray (0.299 R + 0.587 G + 0.114 B)",
                  config("to_gray_csv", "to_gray.csv", **{"data.channels": 1}), config("to_gray_h5", "to_gray.h5"))
    four = gray[:4]
    write_csv("to_rgb.csv", "image,label", [(n, i % 2) for i, (n, _) in enumerate(four)])
    write_h5("to_rgb.h5", [np.repeat(v[..., None], 3, axis=2) for _, v in four], np.array([0, 1, 0, 1], dtype=np.int32))
    same_training("data.channels: 3 repeats gray files into R, G and B",
                  config("to_rgb_csv", "to_rgb.csv", channels=3, **{"data.channels": 3}),
                  config("to_rgb_h5", "to_rgb.h5", channels=3))

    # Whole-slide images: Aperio-style pyramids (tiled, the description OpenSlide knows them
    # by) read through OpenSlide, level 0 and level 1 (data.level).
    slides = []
    for i in range(4):
        a = rng.integers(0, 256, (2 * H, 2 * W, 3)).astype(np.uint8)
        half = rng.integers(0, 256, (H, W, 3)).astype(np.uint8)  # a level of its own, not a downscale
        with tifffile.TiffWriter(path(f"slide{i}.svs")) as w:
            w.write(a, tile=(16, 16), photometric="rgb", compression="zlib", metadata=None,
                    description=f"Aperio Image Library v11.2.1 \r\n{2 * W}x{2 * H} [0,0 {2 * W}x{2 * H}] (16x16) RAW|MPP = 0.5")
            w.write(half, tile=(16, 16), photometric="rgb", compression="zlib", metadata=None, subfiletype=1,
                    description="Aperio Image Library v11.2.1 \r\n")
        slides.append((f"slide{i}.svs", a, half))
    import openslide
    check("the test's slides are Aperio slides to OpenSlide",
          openslide.OpenSlide.detect_format(path("slide0.svs")) == "aperio")
    write_csv("slides.csv", "image,label", [(n, i % 2) for i, (n, _, _) in enumerate(slides)])
    write_h5("slides1.h5", [h.astype(np.float32) for _, _, h in slides], np.array([0, 1, 0, 1], dtype=np.int32))
    same_training("slides through OpenSlide at data.level 1 train as their HDF5 twin",
                  config("slides_csv", "slides.csv", channels=3, **{"data.level": 1}),
                  config("slides_h5", "slides1.h5", channels=3))
    write_h5("slides0.h5", [a.astype(np.float32) for _, a, _ in slides], np.array([0, 1, 0, 1], dtype=np.int32))
    level0 = {"model.input": [2 * H, 2 * W, 3]}
    same_training("and at level 0", config("slides0_csv", "slides.csv", channels=3, **level0),
                  config("slides0_h5", "slides0.h5", channels=3, **level0))
    # A tile missing from a slide (its byte count 0): OpenSlide renders it transparent, and
    # transparent pixels read as data.pad_value.
    holes = []
    for i, (n, a, _) in enumerate(slides):
        data = bytearray(open(path(n), "rb").read())
        with tifffile.TiffFile(path(n)) as t:
            counts = t.pages[0].tags["TileByteCounts"]
            size = {3: 2, 4: 4, 16: 8}[int(counts.dtype)]
        missing = i  # tile (0, i) of level 0 (4 tiles of 16 x 16 pixels across)
        data[counts.valueoffset + size * missing:counts.valueoffset + size * (missing + 1)] = b"\0" * size
        with open(path(f"hole{i}.svs"), "wb") as f:
            f.write(bytes(data))
        v = a.astype(np.float32)
        v[:16, 16 * missing:16 * (missing + 1)] = 9.0
        holes.append(v)
    check("the test's missing tiles are transparent to OpenSlide",
          np.asarray(openslide.OpenSlide(path("hole1.svs")).read_region((16, 0), 0, (16, 16)))[..., 3].max() == 0)
    write_csv("holes.csv", "image,label", [(f"hole{i}.svs", i % 2) for i in range(4)])
    write_h5("holes.h5", holes, np.array([0, 1, 0, 1], dtype=np.int32))
    same_training("a slide's transparent pixels (a missing tile) read as data.pad_value",
                  config("holes_csv", "holes.csv", channels=3, **level0, **{"data.pad_value": 9.0}),
                  config("holes_h5", "holes.h5", channels=3, **level0))

    # 3. Masks (BCE) and class maps (softmax over 3 classes, a palette PNG), per pixel.
    seg = [dict(type="conv2d", filters=4, kernel=3, padding="same"), dict(type="relu"),
           dict(type="conv2d", filters=1, kernel=3, padding="same")]
    imgs, masks, rows = [], [], []
    for i in range(4):
        a = rng.integers(0, 256, (H, W)).astype(np.uint8)
        m = (rng.uniform(0, 1, (H, W)) > 0.6).astype(np.uint8)
        PIL.Image.fromarray(a).save(path(f"seg{i}.png"))
        PIL.Image.fromarray(m).save(path(f"seg{i}-mask.png"))
        imgs.append(a[..., None].astype(np.float32))
        masks.append(m[..., None])
        rows.append((f"seg{i}.png", f"seg{i}-mask.png"))
    write_csv("seg.csv", "image,mask", rows)
    write_h5("seg.h5", imgs, np.stack(masks), kind="masks")
    same_training("masks from PNG train as their HDF5 twin",
                  config("seg_csv", "seg.csv", layers=seg, loss="sigmoid_bce"),
                  config("seg_h5", "seg.h5", layers=seg, loss="sigmoid_bce"))
    maps, rows = [], []
    for i in range(4):
        c = rng.integers(0, 3, (H, W)).astype(np.uint8)
        p = PIL.Image.fromarray(c, mode="P")
        p.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 * 3 - 9))
        p.save(path(f"seg{i}-classes.png"))
        maps.append(c)
        rows.append((f"seg{i}.png", f"seg{i}-classes.png"))
    write_csv("classes.csv", "image,class_map", rows)
    write_h5("classes.h5", imgs, np.stack(maps), kind="masks")
    seg3 = seg[:-1] + [dict(type="conv2d", filters=3, kernel=3, padding="same")]
    same_training("class maps from palette PNGs (their indices) train as their HDF5 twin",
                  config("classes_csv", "classes.csv", layers=seg3), config("classes_h5", "classes.h5", layers=seg3))

    # 4. data.fit: pad and crop, against numpy; data.scale: auto.
    sizes = [(H, W), (H - 6, W), (H, W - 5), (H - 3, W - 9)]
    padded, rows = [], []
    for i, (h, w) in enumerate(sizes):
        a = rng.integers(0, 65536, (h, w)).astype(np.uint16)
        tifffile.imwrite(path(f"pad{i}.tif"), a, tile=(16, 16))
        full = np.full((H, W), 7.0, dtype=np.float32)
        full[:h, :w] = a
        padded.append(full[..., None])
        rows.append((f"pad{i}.tif", i % 2))
    write_csv("pad.csv", "image,label", rows)
    write_h5("pad.h5", padded, np.array([i % 2 for i in range(4)], dtype=np.int32))
    same_training("data.fit: pad (pad_value 7, bottom and right) trains as numpy's padding",
                  config("pad_csv", "pad.csv", **{"data.fit": "pad", "data.pad_value": 7.0}), config("pad_h5", "pad.h5"))
    cropped, rows = [], []
    for i, (dh, dw) in enumerate([(0, 0), (7, 4), (10, 11), (3, 0)]):
        a = rng.integers(0, 256, (H + dh, W + dw)).astype(np.uint8)
        PIL.Image.fromarray(a).save(path(f"crop{i}.png"))
        cropped.append(a[dh // 2:dh // 2 + H, dw // 2:dw // 2 + W, None].astype(np.float32))
        rows.append((f"crop{i}.png", i % 2))
    write_csv("crop.csv", "image,label", rows)
    write_h5("crop.h5", cropped, np.array([i % 2 for i in range(4)], dtype=np.int32))
    same_training("data.fit: crop (at the centre) trains as numpy's crop",
                  config("crop_csv", "crop.csv", **{"data.fit": "crop"}), config("crop_h5", "crop.h5"))
    by_name = dict(gray)
    # data.fit: resize, as torch's F.interpolate: mode 'area' for images (each output pixel the
    # mean of source pixels [i*m//n, ceil((i+1)*m/n)), summed row by row in float64 as the
    # reader does), 'nearest' for masks (source floor(i * float32(m/n))).
    def area(a, n_r, n_c):
        m_r, m_c = a.shape
        out = np.zeros((n_r, n_c), np.float32)
        for i in range(n_r):
            for j in range(n_c):
                y0, y1 = i * m_r // n_r, -(-(i + 1) * m_r // n_r)
                x0, x1 = j * m_c // n_c, -(-(j + 1) * m_c // n_c)
                total = 0.0
                for y in range(y0, y1):
                    for x in range(x0, x1):
                        total += float(a[y, x])
                out[i, j] = np.float32(total / ((y1 - y0) * (x1 - x0)))
        return out

    def nearest(a, n_r, n_c):
        idx = lambda n, m: np.minimum(np.floor(np.arange(n, dtype=np.float32) * (np.float32(m) / np.float32(n))),
                                      m - 1).astype(np.int64)
        return a[idx(n_r, a.shape[0])][:, idx(n_c, a.shape[1])]

    import torch
    import torch.nn.functional as F
    probe = rng.uniform(0, 255, (57, 23))
    t = torch.tensor(probe)[None, None]
    check("the test's area and nearest formulas are torch's F.interpolate (57x23 to 40x32)",
          np.abs(area(probe, H, W) - F.interpolate(t, size=(H, W), mode="area")[0, 0].numpy()).max() < 1e-4
          and np.array_equal(nearest(probe.astype(np.float32), H, W),
                             F.interpolate(t.float(), size=(H, W), mode="nearest")[0, 0].numpy()))
    resized_imgs, resized_masks, rows = [], [], []
    for i, (h, w) in enumerate([(H, W), (57, 45), (29, 23), (83, 31)]):
        a = rng.integers(0, 256, (h, w)).astype(np.uint8)
        mk = (rng.uniform(0, 1, (h, w)) > 0.6).astype(np.uint8)
        PIL.Image.fromarray(a).save(path(f"resize{i}.png"))
        PIL.Image.fromarray(mk).save(path(f"resize{i}-mask.png"))
        resized_imgs.append(area(a.astype(np.float32), H, W)[..., None])
        resized_masks.append(nearest(mk, H, W)[..., None])
        rows.append((f"resize{i}.png", f"resize{i}-mask.png"))
    write_csv("resize.csv", "image,mask", rows)
    write_h5("resize.h5", resized_imgs, np.stack(resized_masks), kind="masks")
    same_training("data.fit: resize: images by area, masks by nearest (larger and smaller ones)",
                  config("resize_csv", "resize.csv", layers=seg, loss="sigmoid_bce", **{"data.fit": "resize"}),
                  config("resize_h5", "resize.h5", layers=seg, loss="sigmoid_bce"))

    mixed = [(n, by_name[n]) for n in ("g8.png", "g16.png", "strips.tif", "tiled.tif")]  # 8-bit and 16-bit files
    write_csv("auto.csv", "image,label", [(n, i % 2) for i, (n, _) in enumerate(mixed)])
    scaled = [(v * np.float32(1.0 / (255.0 if n in ("g8.png", "strips.tif") else 65535.0)))[..., None]
              for n, v in mixed]
    write_h5("auto.h5", scaled, np.array([i % 2 for i in range(4)], dtype=np.int32))
    same_training("data.scale: auto maps each file's integer range to [0, 1]",
                  config("auto_csv", "auto.csv", **{"data.scale": "auto"}), config("auto_h5", "auto.h5", **{"data.scale": 1.0}))

    eight = [(n, by_name[n]) for n in ("g8.png", "g.jpg", "strips.tif", "g8.png")]  # 8-bit files
    write_csv("norm.csv", "image,label", [(n, i % 2) for i, (n, _) in enumerate(eight)])
    normalised = [(((v * np.float32(1.0 / 255.0)).astype(np.float64) - 0.5) / 0.25).astype(np.float32)[..., None]
                  for _, v in eight]
    write_h5("norm.h5", normalised, np.array([i % 2 for i in range(4)], dtype=np.int32))
    same_training("data.mean and data.std after data.scale: auto: (x - mean) / std per channel",
                  config("norm_csv", "norm.csv", **{"data.scale": "auto", "data.mean": [0.5], "data.std": [0.25]}),
                  config("norm_h5", "norm.h5", **{"data.scale": 1.0}))

    # 5. evaluate --data and predict --input from a manifest.
    cfg = path("gray_h5.yaml")  # its run_dir holds the checkpoint
    for command, flag in (("evaluate", "--data"), ("predict", "--input")):
        outs = []
        for source in ("gray.h5", "gray.csv"):
            out = path(f"{command}-{source}.h5")
            args = [BIN, command, cfg, "--checkpoint", path("runs/gray_h5/checkpoints/ckpt-3.h5"), flag, path(source)]
            if command == "predict":
                args += ["--output", out]
            r = subprocess.run(args, capture_output=True, text=True, timeout=300)
            outs.append((r, out))
        (a, oa), (b, ob) = outs
        if command == "evaluate":
            # "... on FILE, 11 images: loss 0.697273 accuracy 0.454545": the figures after the file
            la = [l.split("images:")[-1] for l in a.stdout.splitlines() if "loss" in l]
            lb = [l.split("images:")[-1] for l in b.stdout.splitlines() if "loss" in l]
            check("evaluate --data from the manifest says what it says from the HDF5 file",
                  a.returncode == 0 and b.returncode == 0 and la and la == lb, (a.stdout + a.stderr + b.stderr)[-1500:])
        else:
            same = a.returncode == 0 and b.returncode == 0 and np.array_equal(
                np.asarray(h5py.File(oa, "r")["predictions"]), np.asarray(h5py.File(ob, "r")["predictions"]))
            check("predict --input from the manifest writes what it writes from the HDF5 file", same,
                  (a.stderr + b.stderr)[-1500:])

    # 5a. convert-data: the manifest as an HDF5 file, after data.fit; integers kept.
    def convert(cfg, out):
        return subprocess.run([BIN, "convert-data", cfg, path(out)], capture_output=True, text=True, timeout=300)
    r = convert(path("pad_csv.yaml"), "pad-converted.h5")
    ok = r.returncode == 0 and os.path.exists(path("pad-converted.h5"))
    if ok:
        with h5py.File(path("pad-converted.h5"), "r") as f:
            got, dtype, labels_got = np.asarray(f["images"], np.float32), f["images"].dtype, np.asarray(f["labels"])
        ok = dtype == np.uint16 and np.array_equal(got, np.stack(padded)) and list(labels_got) == [0, 1, 0, 1]
    check("convert-data writes the padded 16-bit TIFFs as uint16 equal to numpy's padding, and their labels", ok,
          (r.stdout + r.stderr)[-1500:])
    c = json.load(open(path("pad_csv.yaml")))
    c["data"] = dict(train=path("pad-converted.h5"), scale=c["data"]["scale"])
    c["run_dir"] = path("runs/pad_converted")
    with open(path("pad_converted.yaml"), "w") as f:
        json.dump(c, f)
    same_training("training from the converted file equals training from the manifest", path("pad_converted.yaml"),
                  path("pad_csv.yaml"))
    r = convert(path("gray_csv.yaml"), "gray-converted.h5")
    ok = r.returncode == 0
    if ok:
        with h5py.File(path("gray-converted.h5"), "r") as f:
            ok = f["images"].dtype == np.float32 and np.array_equal(np.asarray(f["images"]),
                                                                    np.stack([v[..., None] for _, v in gray]))
    check("convert-data of every format (floats, DICOM rescaled) writes float32 equal to the decoded values", ok,
          (r.stdout + r.stderr)[-1500:])
    r = convert(path("seg_csv.yaml"), "seg-converted.h5")
    ok = r.returncode == 0
    if ok:
        with h5py.File(path("seg-converted.h5"), "r") as f:
            ok = f["images"].dtype == np.uint8 and np.array_equal(np.asarray(f["masks"]), np.stack(masks))
    check("convert-data keeps 8-bit images as uint8 and writes the masks", ok, (r.stdout + r.stderr)[-1500:])

    # 5b. A resume finds the manifest as the checkpoint left it, or says what changed.
    for n in ("g8.png", "tiled.tif"):
        shutil.copy(path(n), path(f"again-{n}"))
    write_csv("again.csv", "image,label", [("again-g8.png", 0), ("again-tiled.tif", 1)] * 2)
    cfg = config("again", "again.csv", **{"checkpoint.resume": "auto", "checkpoint.every_steps": 1,
                                          "training.steps": 2})
    first = train(cfg)
    with open(cfg) as f:
        c = json.load(f)
    c["training"]["steps"] = 3
    with open(cfg, "w") as f:
        json.dump(c, f)
    same = train(cfg)
    check("a resume over the same manifest goes on", first.returncode == 0 and same.returncode == 0,
          (first.stderr + same.stderr)[-1500:])
    c["training"]["steps"] = 4
    with open(cfg, "w") as f:
        json.dump(c, f)
    tifffile.imwrite(path("again-tiled.tif"), np.zeros((H, W), np.uint16), tile=(16, 16))
    refused("a resume over an edited manifest file: refused, naming the line and what changed", cfg,
            "is not the data", "line 3: ", "again-tiled.tif", "bytes")
    write_csv("again.csv", "image,label", [("again-g8.png", 0), ("again-tiled.tif", 1)] * 3)
    refused("a resume over a manifest with rows added: refused", cfg, "is not the data", "2 rows added")

    # 6. Bad input: one message naming the CSV line and the file, exit 1.
    write_csv("missing.csv", "image,label", [("g8.png", 0), ("nowhere.png", 1)])
    refused("a missing image: its line and path", config("bad1", "missing.csv"), "missing.csv:3:",
            "nowhere.png: does not exist")
    with open(path("notes.png"), "w") as f:
        f.write("not an image")
    write_csv("text.csv", "image,label", [("notes.png", 0)])
    refused("a file that is no image", config("bad2", "text.csv"), "text.csv:2:", "is not an image halotrain reads")
    raw = open(path("g8.png"), "rb").read()
    with open(path("torn.png"), "wb") as f:
        f.write(raw[:len(raw) // 2])
    write_csv("torn.csv", "image,label", [("torn.png", 0)] * 4)
    refused("a PNG cut short: named, exit 1", config("bad3", "torn.csv"), "torn.png", "libpng")
    write_csv("range.csv", "image,label", [("g8.png", 0), ("g8.png", 5), ("g8.png", 1), ("g8.png", 0)])
    refused("a label out of range: its line", config("bad4", "range.csv"), "range.csv:3: label 5 is not a class id in [0, 2)")
    PIL.Image.fromarray(np.zeros((H, W + 1), np.uint8)).save(path("wide-mask.png"))
    write_csv("maskbad.csv", "image,mask", [("seg0.png", "wide-mask.png")] * 4)
    refused("a mask of another size than its image", config("bad5", "maskbad.csv", layers=seg, loss="sigmoid_bce"),
            "maskbad.csv:2:", "wide-mask.png is 40x33 (H x W) but its image", "is 40x32")
    write_csv("channels.csv", "image,label", [("g8.png", 0), ("rgb0.png", 1)])
    refused("an image with other channels than model.input", config("bad6", "channels.csv"), "channels.csv:3:",
            "has 3 channels; model.input [40, 32, 1] has 1")
    refused("images of other sizes without data.fit", config("bad7", "pad.csv"), "pad.csv:3:",
            "is 34x32 (H x W), but model.input [40, 32, 1] needs 40x32; set data.fit: pad or crop")
    # An interlaced PNG must be decoded whole: one whose header claims 200000 x 200000 pixels
    # would need more memory than the machine has, which train and predict say before any step.
    import struct
    import zlib
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    with open(path("vast.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 200000, 200000, 8, 0, 0, 0, 1))
                + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    write_csv("vast.csv", "image,label", [("vast.png", 0), ("g8.png", 1)] * 2)
    refused("an interlaced PNG too large to decode whole: refused before any step", config(
        "bad9", "vast.csv", **{"data.fit": "resize"}), "vast.png", "cannot be streamed and are decoded whole")
    r = subprocess.run([BIN, "predict", path("bad9.yaml"), "--checkpoint", path("runs/gray_h5/checkpoints/ckpt-3.h5"),
                        "--input", path("vast.csv"), "--output", path("vast-out.h5")], capture_output=True, text=True,
                       timeout=120)
    check("and predict --input too", r.returncode == 1 and "cannot be streamed and are decoded whole" in r.stderr
          and not os.path.exists(path("vast-out.h5")), r.stderr[-800:])
    write_csv("nohead.csv", "file,label", [("g8.png", 0)])
    refused("a manifest without an image column", config("bad8", "nohead.csv"), "nohead.csv:1:", "no 'image' column")


if __name__ == "__main__":
    main()
    print(f"{RESULTS.count(False)} failed" if False in RESULTS else "all passed")
    sys.exit(0 if RESULTS and all(RESULTS) else 1)
