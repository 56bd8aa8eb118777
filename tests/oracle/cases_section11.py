"""Oracle cases of SPEC section 11 (the layers of current models), as blocks of the models
that use them: EfficientNet's MBConv with squeeze-excitation and SiLU, a ConvNeXt block with
layer norm, GELU, layer scale and stochastic depth, DeepLab's ASPP with its pooling branch,
a ResNeXt bottleneck with a grouped conv, a DenseNet block and transition, ShuffleNet's
channel split and shuffle, VGG's flatten of a small map, nnU-Net's instance and group norm,
windows that are not square (InceptionV3's 1x7 / 7x1), and a tail of maps too small for
the grid. oracle.py runs each like its own cases.
"""

ADAM = dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4)
SGD = dict(type="sgd", lr=0.05, momentum=0.9)

CASES = {
    # EfficientNet-B0's MBConv: expand, depthwise, squeeze-excitation (global pool -> 1x1
    # convs on the channel vector -> sigmoid gate -> multiply), project, stochastic depth.
    "mbconv_se_adam": dict(
        input=[37, 29, 1], loss="softmax_cross_entropy", classes=2, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, stride=2, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="silu", name="stem"),
            dict(type="conv2d", filters=8, kernel=1, bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="silu"),
            dict(type="depthwise_conv2d", kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="silu", name="dw"),
            dict(type="global_avg_pool", name="se_pool"),
            dict(type="conv2d", filters=2, kernel=1, name="se_reduce"),
            dict(type="silu"),
            dict(type="conv2d", filters=8, kernel=1, name="se_expand"),
            dict(type="sigmoid", name="gate"),
            dict(type="multiply", inputs=["dw", "gate"], name="se"),
            dict(type="conv2d", filters=4, kernel=1, bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="drop_path", rate=0.3, name="dp"),
            dict(type="add", inputs=["dp", "stem"]),
            dict(type="global_avg_pool"),
            dict(type="dropout", rate=0.2),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # ConvNeXt: a 4x4/4 patchify stem, a block (7x7 depthwise, layer norm over channels, an
    # inverted bottleneck with GELU, layer scale, stochastic depth), a 2x2/2 downsample, and
    # a head with layer norm on the pooled vector.
    "convnext_adam": dict(
        input=[34, 30, 2], loss="softmax_cross_entropy", classes=3, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=6, kernel=4, stride=4),
            dict(type="layer_norm", name="stem"),
            dict(type="depthwise_conv2d", kernel=7, padding=3),
            dict(type="layer_norm"),
            dict(type="conv2d", filters=24, kernel=1),
            dict(type="gelu"),
            dict(type="conv2d", filters=6, kernel=1),
            dict(type="scale"),
            dict(type="drop_path", rate=0.25, name="dp"),
            dict(type="add", inputs=["dp", "stem"]),
            dict(type="layer_norm", epsilon=1e-5),
            dict(type="conv2d", filters=8, kernel=2, stride=2),
            dict(type="gelu", approximate="tanh"),
            dict(type="global_avg_pool"),
            dict(type="layer_norm"),
            dict(type="dense", units=3),
        ],
        grids=[[1, 1], [2, 2], [2, 1], [1, 3], [4, 1]],
        mpi=[(4, [2, 2])],
    ),
    # DeepLabV3's ASPP: a 1x1 branch (batch norm + ReLU6: a fused chain), a dilated 3x3
    # branch and the pooling branch (global pool -> 1x1 conv -> batch norm over the batch ->
    # upsampled to the map), concatenated, then resized to the input by bilinear
    # interpolation; per-pixel softmax over 3 classes.
    "aspp_softmax_sgd": dict(
        input=[40, 36, 1], loss="softmax_cross_entropy", masks=True, classes=3, optimizer=SGD,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, stride=2, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu", name="feat"),
            dict(type="conv2d", filters=3, kernel=1, bias=False, inputs=["feat"]),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu6", name="a"),
            dict(type="conv2d", filters=3, kernel=3, dilation=2, padding="same", inputs=["feat"]),
            dict(type="hard_swish", name="b"),
            dict(type="global_avg_pool", inputs=["feat"]),
            dict(type="conv2d", filters=3, kernel=1, bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="upsampling2d", size=[20, 18], interpolation="bilinear", name="pooled"),
            dict(type="concatenate", inputs=["a", "b", "pooled"]),
            dict(type="conv2d", filters=3, kernel=1),
            dict(type="resize", size=[40, 36], interpolation="bilinear"),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # ResNeXt's bottleneck: a grouped 3x3 conv between 1x1 convs, a strided shortcut; the
    # clip and hard-sigmoid activations of MobileNetV3.
    "grouped_bottleneck_sgd": dict(
        input=[33, 35, 2], loss="softmax_cross_entropy", classes=2, optimizer=SGD,
        layers=[
            dict(type="conv2d", filters=8, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu", name="in"),
            dict(type="conv2d", filters=8, kernel=1, bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="clip", min=-0.5, max=1.5),
            dict(type="conv2d", filters=8, kernel=3, stride=2, padding=1, groups=4, bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="hard_sigmoid", alpha=0.3, beta=0.4),
            dict(type="conv2d", filters=12, kernel=1, name="main"),
            dict(type="conv2d", filters=12, kernel=1, stride=2, inputs=["in"], name="short"),
            dict(type="add", inputs=["main", "short"]),
            dict(type="relu"),
            dict(type="global_max_pool"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # DenseNet: BN-ReLU-conv layers concatenated onto the block's input, a transition with
    # an average pool that counts its padding, ceil-mode max pooling (SqueezeNet, GoogLeNet);
    # ShuffleNet's channel split, shuffle and concatenation.
    "dense_shuffle_adam": dict(
        input=[31, 27, 1], loss="softmax_cross_entropy", classes=2, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", name="b0"),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="conv2d", filters=2, kernel=3, padding="same", name="g1"),
            dict(type="concatenate", inputs=["b0", "g1"], name="b1"),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="conv2d", filters=2, kernel=3, padding="same", name="g2"),
            dict(type="concatenate", inputs=["b1", "g2"]),
            dict(type="avg_pool2d", pool=3, stride=2, padding=1, count_include_pad=True),
            dict(type="max_pool2d", pool=3, stride=2, ceil_mode=True, name="t"),
            dict(type="channel_slice", start=0, channels=4, name="left"),
            dict(type="channel_slice", start=4, channels=4, inputs=["t"]),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="leaky_relu", alpha=0.1, name="right"),
            dict(type="concatenate", inputs=["left", "right"]),
            dict(type="channel_shuffle", groups=2),
            dict(type="avg_pool2d", pool=2, ceil_mode=True),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [2, 1], [1, 2]],
        mpi=[(4, [2, 2])],
    ),
    # VGG's head: the last small map flattened (gathered to every shard, Keras's (h, w, c)
    # order) into dense layers.
    "vgg_flatten_sgd": dict(
        input=[28, 22, 1], loss="softmax_cross_entropy", classes=3, optimizer=SGD,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="flatten"),
            dict(type="dense", units=6),
            dict(type="relu"),
            dict(type="dropout", rate=0.3),
            dict(type="dense", units=3),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # nnU-Net: conv, instance norm, leaky ReLU, a strided conv down, group norm, a transposed
    # conv up, group norm of one group, the skip concatenated, group norm of one channel per
    # group; per-pixel softmax.
    "nnunet_norms_adam": dict(
        input=[36, 32, 1], loss="softmax_cross_entropy", masks=True, classes=2, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="instance_norm"),
            dict(type="leaky_relu", alpha=0.01, name="e1"),
            dict(type="conv2d", filters=6, kernel=3, stride=2, padding=1),
            dict(type="group_norm", groups=2, epsilon=1e-3),
            dict(type="leaky_relu", alpha=0.01),
            dict(type="conv2d_transpose", filters=4, kernel=2, stride=2),
            dict(type="group_norm", groups=1, name="up"),
            dict(type="concatenate", inputs=["up", "e1"]),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="group_norm", groups=4, center=False),
            dict(type="leaky_relu", alpha=0.01),
            dict(type="conv2d", filters=2, kernel=1),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # Raw 16-bit-like pixels (around 1e4): the sharded statistics of instance and group norm
    # as exact as the whole image's.
    "large_mean_norms_sgd": dict(
        input=[30, 26, 1], loss="sigmoid_bce", masks=True, optimizer=dict(type="sgd", lr=0.01, momentum=0.9),
        pixels=(9000.0, 11000.0),
        layers=[
            dict(type="instance_norm", scale=False, center=False),
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="group_norm", groups=3),
            dict(type="tanh"),
            dict(type="conv2d", filters=1, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2]],
        mpi=[(4, [2, 2])],
    ),
    # InceptionV3's factorised 1x7 and 7x1 convs, a 3x1 pool with stride [2, 1], asymmetric
    # dilation and per-side padding.
    "nonsquare_windows_adam": dict(
        input=[34, 31, 1], loss="softmax_cross_entropy", classes=2, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=3, kernel=[1, 7], padding="same"),
            dict(type="relu"),
            dict(type="conv2d", filters=3, kernel=[7, 1], padding="same"),
            dict(type="relu"),
            dict(type="max_pool2d", pool=[3, 1], stride=[2, 1], padding=[1, 0]),
            dict(type="conv2d", filters=4, kernel=[3, 2], dilation=[2, 1], padding=[[2, 1], [0, 1]]),
            dict(type="tanh"),
            dict(type="depthwise_conv2d", kernel=[5, 3], stride=[1, 2], padding="same"),
            dict(type="avg_pool2d", pool=[2, 3], stride=[2, 1]),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # Resizing by ratios that are no integers (torchvision's segmentation heads resize to the
    # input's size, whatever the backbone's stride made of it).
    "resize_any_ratio_adam": dict(
        input=[30, 27, 1], loss="sigmoid_bce", masks=True, optimizer=ADAM,
        layers=[
            dict(type="conv2d", filters=3, kernel=3, stride=3),
            dict(type="relu"),
            dict(type="resize", size=[17, 13], interpolation="bilinear"),
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="tanh"),
            dict(type="resize", size=[30, 27], interpolation="nearest"),
            dict(type="conv2d", filters=1, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 3]],
        mpi=[(4, [2, 2])],
    ),
    # A tail: the last maps (3x3, then 1x1 after a valid 3x3 average pool, as ResNet50's 7x7
    # pool at 224) are smaller than the grid; they are gathered and the layers from there on
    # run replicated.
    "small_tail_sgd": dict(
        input=[24, 26, 1], loss="softmax_cross_entropy", classes=2, optimizer=SGD,
        layers=[
            dict(type="conv2d", filters=4, kernel=3, stride=2, padding="same"),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=4, kernel=3, stride=2, padding="same"),
            dict(type="relu"),
            dict(type="conv2d", filters=5, kernel=3, padding="same"),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="avg_pool2d", pool=3),
            dict(type="flatten"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [4, 2], [3, 4]],
        mpi=[(4, [4, 1])],
    ),
}
