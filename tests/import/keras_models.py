"""keras.applications as Keras 2.1.6 and 2.2.4 wrote them with model.to_json(), at reduced
width: the test data of tests/import/keras_apps_test.py. No Keras is needed: each builder
below follows the code of its application in that release (keras/applications/*.py of
2.1.6; keras_applications 1.0.6, which 2.2.4 required, for MobileNet and InceptionV3), with
the same layer classes, the same names (given, or generated as Keras generated them: the
class name in snake case numbered per class from 1 in creation order, `input_1` for the
input) and the same config attributes, but with every channel count divided and some
repeated blocks left out, so that a float64 PyTorch run of each takes seconds.

The layers are listed in the order Model.get_config() lists them (Network.layers: by
depth from the output, the deepest first, ties in the order of a depth-first walk from
the output), so a reader that runs them in file order runs them in a topological order.

Standard library only. `python3 keras_models.py [DIR]` validates every model (names,
connections, and the shapes followed through) and writes each JSON to DIR when given.
"""
import json
import os
import re
import sys

CHANNELS_LAST = "channels_last"


def L(cls, name, inbound, **config):
    """One functional-API layer as Model.get_config() writes it; `inbound`: the names of
    the layers whose (single) outputs it is called on."""
    return {"name": name, "class_name": cls, "config": {"name": name, **config},
            "inbound_nodes": [] if cls == "InputLayer" else [[[i, 0, 0, {}] for i in inbound]]}


def glorot_uniform():
    return {"class_name": "VarianceScaling",
            "config": {"scale": 1.0, "mode": "fan_avg", "distribution": "uniform", "seed": None}}


def zeros():
    return {"class_name": "Zeros", "config": {}}


def ones():
    return {"class_name": "Ones", "config": {}}


def pair(v):
    """conv_utils.normalize_tuple(v, 2): what Keras stores (a tuple, a list in JSON)."""
    return [v, v] if isinstance(v, int) else list(v)


def snake(cls):
    """keras.engine.topology._to_snake_case."""
    s = re.sub("(.)([A-Z][a-z0-9]+)", r"\1_\2", cls)
    return re.sub("([a-z])([A-Z])", r"\1_\2", s).lower()


def inbound_names(layer):
    nodes = layer["inbound_nodes"]
    return [i[0] for i in nodes[0]] if nodes else []


def keras_order(layers, output):
    """Network.__init__'s ordering of its layers (one node per layer here): a depth-first
    walk from the output numbers the layers (pre-order) and lists the nodes (post-order);
    the reversed post-order gives each layer its depth, the longest path to the output;
    the layers go deepest first, ties by walk number."""
    by_name = {l["name"]: l for l in layers}
    index, post, done = {}, [], set()

    def walk(n):
        if n in done:
            return
        index.setdefault(n, len(index))
        for i in inbound_names(by_name[n]):
            walk(i)
        done.add(n)
        post.append(n)

    walk(output)
    if len(post) != len(layers):
        raise ValueError(f"layers that do not reach the output: {sorted(set(by_name) - done)}")
    depth = {}
    for n in reversed(post):
        d = depth.setdefault(n, 0)
        for i in inbound_names(by_name[n]):
            depth[i] = max(depth.get(i, 0), d + 1)
    return [by_name[n] for n in sorted(post, key=lambda n: (-depth[n], index[n]))]


class Graph:
    """The layers of one functional model being built, named as Keras names them; the
    methods take and return layer names (a layer's one output stands for its tensor)."""

    def __init__(self, keras_version):
        self.keras_version = keras_version
        self.layers, self.inputs, self.uids = [], [], {}

    def _uid(self, prefix):
        self.uids[prefix] = self.uids.get(prefix, 0) + 1
        return f"{prefix}_{self.uids[prefix]}"

    def layer(self, cls, inbound, name=None, **config):
        name = name or self._uid(snake(cls.split(">")[-1]))
        if name in {l["name"] for l in self.layers}:
            raise ValueError(f"layer name {name} used twice")
        self.layers.append(L(cls, name, [inbound] if isinstance(inbound, str) else list(inbound),
                             trainable=True, **config))
        return name

    def input(self, shape, name=None):
        name = name or self._uid("input")
        self.layers.append(L("InputLayer", name, [], batch_input_shape=[None] + list(shape), dtype="float32",
                             sparse=False))
        self.inputs.append(name)
        return name

    def model(self, name, output):
        return {"class_name": "Model",
                "config": {"name": name, "layers": keras_order(self.layers, output),
                           "input_layers": [[i, 0, 0] for i in self.inputs], "output_layers": [[output, 0, 0]]},
                "keras_version": self.keras_version, "backend": "tensorflow"}

    # -- layers, their get_config() keys in Keras's order --
    def conv2d(self, x, filters, kernel_size, strides=(1, 1), padding="valid", activation=None, use_bias=True,
               dilation_rate=(1, 1), groups=None, name=None):
        c = dict(filters=filters, kernel_size=pair(kernel_size), strides=pair(strides), padding=padding,
                 data_format=CHANNELS_LAST, dilation_rate=pair(dilation_rate))
        if groups is not None:  # tf.keras >= 2.3
            c["groups"] = groups
        c.update(activation=activation or "linear", use_bias=use_bias, kernel_initializer=glorot_uniform(),
                 bias_initializer=zeros(), kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None)
        return self.layer("Conv2D", x, name, **c)

    def depthwise_conv2d(self, x, kernel_size, strides=(1, 1), padding="valid", depth_multiplier=1, activation=None,
                         use_bias=True, name=None):
        return self.layer("DepthwiseConv2D", x, name, kernel_size=pair(kernel_size), strides=pair(strides),
                          padding=padding, data_format=CHANNELS_LAST, dilation_rate=[1, 1],
                          activation=activation or "linear", use_bias=use_bias, bias_initializer=zeros(),
                          bias_regularizer=None, activity_regularizer=None, bias_constraint=None,
                          depth_multiplier=depth_multiplier, depthwise_initializer=glorot_uniform(),
                          depthwise_regularizer=None, depthwise_constraint=None)

    def separable_conv2d(self, x, filters, kernel_size, strides=(1, 1), padding="valid", use_bias=True, name=None):
        return self.layer("SeparableConv2D", x, name, filters=filters, kernel_size=pair(kernel_size),
                          strides=pair(strides), padding=padding, data_format=CHANNELS_LAST, dilation_rate=[1, 1],
                          activation="linear", use_bias=use_bias, bias_initializer=zeros(), bias_regularizer=None,
                          activity_regularizer=None, bias_constraint=None, depth_multiplier=1,
                          depthwise_initializer=glorot_uniform(), pointwise_initializer=glorot_uniform(),
                          depthwise_regularizer=None, pointwise_regularizer=None, depthwise_constraint=None,
                          pointwise_constraint=None)

    def batch_norm(self, x, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True, name=None):
        return self.layer("BatchNormalization", x, name, axis=axis, momentum=momentum, epsilon=epsilon,
                          center=center, scale=scale, beta_initializer=zeros(), gamma_initializer=ones(),
                          moving_mean_initializer=zeros(), moving_variance_initializer=ones(),
                          beta_regularizer=None, gamma_regularizer=None, beta_constraint=None, gamma_constraint=None)

    def activation(self, x, activation, name=None):
        return self.layer("Activation", x, name, activation=activation)

    def relu(self, x, max_value=None, negative_slope=0.0, threshold=0.0, name=None):  # keras >= 2.2.0
        return self.layer("ReLU", x, name, max_value=None if max_value is None else float(max_value),
                          negative_slope=float(negative_slope), threshold=float(threshold))

    def leaky_relu(self, x, alpha=0.3, name=None):
        return self.layer("LeakyReLU", x, name, alpha=float(alpha))

    def _pool(self, cls, x, pool_size, strides, padding, name):
        return self.layer(cls, x, name, pool_size=pair(pool_size), padding=padding,
                          strides=pair(pool_size if strides is None else strides), data_format=CHANNELS_LAST)

    def max_pool(self, x, pool_size=(2, 2), strides=None, padding="valid", name=None):
        return self._pool("MaxPooling2D", x, pool_size, strides, padding, name)

    def avg_pool(self, x, pool_size=(2, 2), strides=None, padding="valid", name=None):
        return self._pool("AveragePooling2D", x, pool_size, strides, padding, name)

    def global_avg_pool(self, x, name=None):
        return self.layer("GlobalAveragePooling2D", x, name, data_format=CHANNELS_LAST)

    def zero_pad(self, x, padding=(1, 1), name=None):
        if isinstance(padding, int):
            padding = ((padding, padding), (padding, padding))
        elif isinstance(padding[0], int):
            padding = ((padding[0], padding[0]), (padding[1], padding[1]))
        return self.layer("ZeroPadding2D", x, name, padding=[list(p) for p in padding], data_format=CHANNELS_LAST)

    def flatten(self, x, name=None):
        return self.layer("Flatten", x, name, data_format=CHANNELS_LAST)

    def dense(self, x, units, activation=None, use_bias=True, name=None):
        return self.layer("Dense", x, name, units=units, activation=activation or "linear", use_bias=use_bias,
                          kernel_initializer=glorot_uniform(), bias_initializer=zeros(), kernel_regularizer=None,
                          bias_regularizer=None, activity_regularizer=None, kernel_constraint=None,
                          bias_constraint=None)

    def dropout(self, x, rate, noise_shape=None, seed=None, name=None):
        return self.layer("Dropout", x, name, rate=rate, noise_shape=noise_shape, seed=seed)

    def reshape(self, x, target_shape, name=None):
        return self.layer("Reshape", x, name, target_shape=list(target_shape))

    def add(self, xs, name=None):
        return self.layer("Add", xs, name)

    def multiply(self, xs, name=None):
        return self.layer("Multiply", xs, name)

    def concatenate(self, xs, axis=-1, name=None):
        return self.layer("Concatenate", xs, name, axis=axis)


# ------------------------------------------------------------------ VGG16 (Keras 2.1.6)

def vgg16():
    """VGG16 at widths 64, 128, 256, 512, 512 -> 4, 8, 16, 16, 16 and fc 4096 -> 32."""
    g = Graph("2.1.6")
    x = g.input((96, 80, 3))
    for block, (filters, convs) in enumerate(zip((4, 8, 16, 16, 16), (2, 2, 3, 3, 3)), 1):
        for i in range(1, convs + 1):
            x = g.conv2d(x, filters, (3, 3), activation="relu", padding="same", name=f"block{block}_conv{i}")
        x = g.max_pool(x, (2, 2), strides=(2, 2), name=f"block{block}_pool")
    x = g.flatten(x, name="flatten")
    x = g.dense(x, 32, activation="relu", name="fc1")
    x = g.dense(x, 32, activation="relu", name="fc2")
    x = g.dense(x, 2, activation="softmax", name="predictions")
    return g.model("vgg16", x)


# ------------------------------------------------------------------ ResNet50 (Keras 2.1.6)

def resnet_identity_block(g, x, kernel_size, filters, stage, block):
    filters1, filters2, filters3 = filters
    conv_name_base = f"res{stage}{block}_branch"
    bn_name_base = f"bn{stage}{block}_branch"
    y = g.conv2d(x, filters1, (1, 1), name=conv_name_base + "2a")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2a")
    y = g.activation(y, "relu")
    y = g.conv2d(y, filters2, kernel_size, padding="same", name=conv_name_base + "2b")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2b")
    y = g.activation(y, "relu")
    y = g.conv2d(y, filters3, (1, 1), name=conv_name_base + "2c")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2c")
    y = g.add([y, x])
    return g.activation(y, "relu")


def resnet_conv_block(g, x, kernel_size, filters, stage, block, strides=(2, 2)):
    filters1, filters2, filters3 = filters
    conv_name_base = f"res{stage}{block}_branch"
    bn_name_base = f"bn{stage}{block}_branch"
    y = g.conv2d(x, filters1, (1, 1), strides=strides, name=conv_name_base + "2a")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2a")
    y = g.activation(y, "relu")
    y = g.conv2d(y, filters2, kernel_size, padding="same", name=conv_name_base + "2b")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2b")
    y = g.activation(y, "relu")
    y = g.conv2d(y, filters3, (1, 1), name=conv_name_base + "2c")
    y = g.batch_norm(y, axis=3, name=bn_name_base + "2c")
    shortcut = g.conv2d(x, filters3, (1, 1), strides=strides, name=conv_name_base + "1")
    shortcut = g.batch_norm(shortcut, axis=3, name=bn_name_base + "1")
    y = g.add([y, shortcut])
    return g.activation(y, "relu")


def resnet50():
    """ResNet50 at widths / 16, one identity block per stage (of 2, 3, 5, 2)."""
    g = Graph("2.1.6")
    img_input = g.input((224, 224, 3))
    x = g.zero_pad(img_input, (3, 3), name="conv1_pad")
    x = g.conv2d(x, 4, (7, 7), strides=(2, 2), padding="valid", name="conv1")
    x = g.batch_norm(x, axis=3, name="bn_conv1")
    x = g.activation(x, "relu")
    x = g.max_pool(x, (3, 3), strides=(2, 2))

    x = resnet_conv_block(g, x, 3, [4, 4, 16], stage=2, block="a", strides=(1, 1))
    x = resnet_identity_block(g, x, 3, [4, 4, 16], stage=2, block="b")
    x = resnet_conv_block(g, x, 3, [8, 8, 32], stage=3, block="a")
    x = resnet_identity_block(g, x, 3, [8, 8, 32], stage=3, block="b")
    x = resnet_conv_block(g, x, 3, [16, 16, 64], stage=4, block="a")
    x = resnet_identity_block(g, x, 3, [16, 16, 64], stage=4, block="b")
    x = resnet_conv_block(g, x, 3, [32, 32, 128], stage=5, block="a")
    x = resnet_identity_block(g, x, 3, [32, 32, 128], stage=5, block="b")

    x = g.avg_pool(x, (7, 7), name="avg_pool")
    x = g.flatten(x)
    x = g.dense(x, 2, activation="softmax", name="fc1000")
    return g.model("resnet50", x)


# ------------------------------------------------------------------ InceptionV3 (Keras 2.2.4)

def inception_conv2d_bn(g, x, filters, num_row, num_col, padding="same", strides=(1, 1), name=None):
    conv_name = None if name is None else name + "_conv"
    bn_name = None if name is None else name + "_bn"
    x = g.conv2d(x, filters, (num_row, num_col), strides=strides, padding=padding, use_bias=False, name=conv_name)
    x = g.batch_norm(x, axis=3, scale=False, name=bn_name)
    return g.activation(x, "relu", name=name)


def inception_v3():
    """InceptionV3 at widths / 8 with mixed0, 3, 4, 8 and 9 of mixed0..10; an open input."""
    g = Graph("2.2.4")
    conv2d_bn = lambda *a, **k: inception_conv2d_bn(g, *a, **k)  # noqa: E731
    img_input = g.input((None, None, 3))
    channel_axis = 3
    x = conv2d_bn(img_input, 4, 3, 3, strides=(2, 2), padding="valid")
    x = conv2d_bn(x, 4, 3, 3, padding="valid")
    x = conv2d_bn(x, 8, 3, 3)
    x = g.max_pool(x, (3, 3), strides=(2, 2))
    x = conv2d_bn(x, 10, 1, 1, padding="valid")
    x = conv2d_bn(x, 24, 3, 3, padding="valid")
    x = g.max_pool(x, (3, 3), strides=(2, 2))

    # mixed 0: 35 x 35 x 256 (/ 8)
    branch1x1 = conv2d_bn(x, 8, 1, 1)
    branch5x5 = conv2d_bn(x, 6, 1, 1)
    branch5x5 = conv2d_bn(branch5x5, 8, 5, 5)
    branch3x3dbl = conv2d_bn(x, 8, 1, 1)
    branch3x3dbl = conv2d_bn(branch3x3dbl, 12, 3, 3)
    branch3x3dbl = conv2d_bn(branch3x3dbl, 12, 3, 3)
    branch_pool = g.avg_pool(x, (3, 3), strides=(1, 1), padding="same")
    branch_pool = conv2d_bn(branch_pool, 4, 1, 1)
    x = g.concatenate([branch1x1, branch5x5, branch3x3dbl, branch_pool], axis=channel_axis, name="mixed0")

    # mixed 3: 17 x 17 x 768 (/ 8)
    branch3x3 = conv2d_bn(x, 48, 3, 3, strides=(2, 2), padding="valid")
    branch3x3dbl = conv2d_bn(x, 8, 1, 1)
    branch3x3dbl = conv2d_bn(branch3x3dbl, 12, 3, 3)
    branch3x3dbl = conv2d_bn(branch3x3dbl, 12, 3, 3, strides=(2, 2), padding="valid")
    branch_pool = g.max_pool(x, (3, 3), strides=(2, 2))
    x = g.concatenate([branch3x3, branch3x3dbl, branch_pool], axis=channel_axis, name="mixed3")

    # mixed 4: 17 x 17 x 768 (/ 8)
    branch1x1 = conv2d_bn(x, 24, 1, 1)
    branch7x7 = conv2d_bn(x, 16, 1, 1)
    branch7x7 = conv2d_bn(branch7x7, 16, 1, 7)
    branch7x7 = conv2d_bn(branch7x7, 24, 7, 1)
    branch7x7dbl = conv2d_bn(x, 16, 1, 1)
    branch7x7dbl = conv2d_bn(branch7x7dbl, 16, 7, 1)
    branch7x7dbl = conv2d_bn(branch7x7dbl, 16, 1, 7)
    branch7x7dbl = conv2d_bn(branch7x7dbl, 16, 7, 1)
    branch7x7dbl = conv2d_bn(branch7x7dbl, 24, 1, 7)
    branch_pool = g.avg_pool(x, (3, 3), strides=(1, 1), padding="same")
    branch_pool = conv2d_bn(branch_pool, 24, 1, 1)
    x = g.concatenate([branch1x1, branch7x7, branch7x7dbl, branch_pool], axis=channel_axis, name="mixed4")

    # mixed 8: 8 x 8 x 1280 (/ 8)
    branch3x3 = conv2d_bn(x, 24, 1, 1)
    branch3x3 = conv2d_bn(branch3x3, 40, 3, 3, strides=(2, 2), padding="valid")
    branch7x7x3 = conv2d_bn(x, 24, 1, 1)
    branch7x7x3 = conv2d_bn(branch7x7x3, 24, 1, 7)
    branch7x7x3 = conv2d_bn(branch7x7x3, 24, 7, 1)
    branch7x7x3 = conv2d_bn(branch7x7x3, 24, 3, 3, strides=(2, 2), padding="valid")
    branch_pool = g.max_pool(x, (3, 3), strides=(2, 2))
    x = g.concatenate([branch3x3, branch7x7x3, branch_pool], axis=channel_axis, name="mixed8")

    # mixed 9: 8 x 8 x 2048 (/ 8), the first of its two iterations
    i = 0
    branch1x1 = conv2d_bn(x, 40, 1, 1)
    branch3x3 = conv2d_bn(x, 48, 1, 1)
    branch3x3_1 = conv2d_bn(branch3x3, 48, 1, 3)
    branch3x3_2 = conv2d_bn(branch3x3, 48, 3, 1)
    branch3x3 = g.concatenate([branch3x3_1, branch3x3_2], axis=channel_axis, name=f"mixed9_{i}")
    branch3x3dbl = conv2d_bn(x, 56, 1, 1)
    branch3x3dbl = conv2d_bn(branch3x3dbl, 48, 3, 3)
    branch3x3dbl_1 = conv2d_bn(branch3x3dbl, 48, 1, 3)
    branch3x3dbl_2 = conv2d_bn(branch3x3dbl, 48, 3, 1)
    branch3x3dbl = g.concatenate([branch3x3dbl_1, branch3x3dbl_2], axis=channel_axis)
    branch_pool = g.avg_pool(x, (3, 3), strides=(1, 1), padding="same")
    branch_pool = conv2d_bn(branch_pool, 24, 1, 1)
    x = g.concatenate([branch1x1, branch3x3, branch3x3dbl, branch_pool], axis=channel_axis, name=f"mixed{9 + i}")

    x = g.global_avg_pool(x, name="avg_pool")
    x = g.dense(x, 2, activation="softmax", name="predictions")
    return g.model("inception_v3", x)


# ------------------------------------------------------------------ MobileNet (2.2.4 and 2.1.6)
# The two releases differ in the padding and in the activation:
#   2.1.6: ZeroPadding2D(padding=(1, 1)) before conv1 and before every depthwise conv
#          (stride 1 or 2), the depthwise conv 'valid'; Activation(relu6) (a function of
#          keras.applications.mobilenet, serialized by its name "relu6").
#   2.2.4: ZeroPadding2D(((0, 1), (0, 1))) before conv1 and before the stride-2 depthwise
#          convs only ('valid' there, 'same' for stride 1); ReLU(6.) layers.

def mobilenet_relu6(g, x, name):
    if g.keras_version.startswith("2.1"):
        return g.activation(x, "relu6", name=name)
    return g.relu(x, 6.0, name=name)


def mobilenet_conv_block(g, inputs, filters, alpha, kernel=(3, 3), strides=(1, 1)):
    filters = int(filters * alpha)
    v21 = g.keras_version.startswith("2.1")
    x = g.zero_pad(inputs, (1, 1) if v21 else ((0, 1), (0, 1)), name="conv1_pad")
    x = g.conv2d(x, filters, kernel, padding="valid", use_bias=False, strides=strides, name="conv1")
    x = g.batch_norm(x, axis=-1, name="conv1_bn")
    return mobilenet_relu6(g, x, "conv1_relu")


def mobilenet_depthwise_conv_block(g, inputs, pointwise_conv_filters, alpha, depth_multiplier=1, strides=(1, 1),
                                   block_id=1):
    pointwise_conv_filters = int(pointwise_conv_filters * alpha)
    if g.keras_version.startswith("2.1"):
        x = g.zero_pad(inputs, (1, 1), name=f"conv_pad_{block_id}")
        padding = "valid"
    elif strides == (1, 1):
        x, padding = inputs, "same"
    else:
        x = g.zero_pad(inputs, ((0, 1), (0, 1)), name=f"conv_pad_{block_id}")
        padding = "valid"
    x = g.depthwise_conv2d(x, (3, 3), padding=padding, depth_multiplier=depth_multiplier, strides=strides,
                           use_bias=False, name=f"conv_dw_{block_id}")
    x = g.batch_norm(x, axis=-1, name=f"conv_dw_{block_id}_bn")
    x = mobilenet_relu6(g, x, f"conv_dw_{block_id}_relu")
    x = g.conv2d(x, pointwise_conv_filters, (1, 1), padding="same", use_bias=False, strides=(1, 1),
                 name=f"conv_pw_{block_id}")
    x = g.batch_norm(x, axis=-1, name=f"conv_pw_{block_id}_bn")
    return mobilenet_relu6(g, x, f"conv_pw_{block_id}_relu")


def _mobilenet(keras_version, rows=96, alpha=0.125, depth_multiplier=1, dropout=1e-3, classes=2):
    """MobileNet with alpha 1/8 (32 ... 1024 -> 4 ... 128), blocks 8-11 (four of the five
    repeated 512-channel blocks) left out."""
    g = Graph(keras_version)
    block = lambda x, f, **k: mobilenet_depthwise_conv_block(g, x, f, alpha, depth_multiplier, **k)  # noqa: E731
    img_input = g.input((rows, rows, 3))
    x = mobilenet_conv_block(g, img_input, 32, alpha, strides=(2, 2))
    x = block(x, 64, block_id=1)
    x = block(x, 128, strides=(2, 2), block_id=2)
    x = block(x, 128, block_id=3)
    x = block(x, 256, strides=(2, 2), block_id=4)
    x = block(x, 256, block_id=5)
    x = block(x, 512, strides=(2, 2), block_id=6)
    x = block(x, 512, block_id=7)
    x = block(x, 1024, strides=(2, 2), block_id=12)
    x = block(x, 1024, block_id=13)

    shape = (1, 1, int(1024 * alpha))
    x = g.global_avg_pool(x)
    x = g.reshape(x, shape, name="reshape_1")
    x = g.dropout(x, dropout, name="dropout")
    x = g.conv2d(x, classes, (1, 1), padding="same", name="conv_preds")
    x = g.activation(x, "softmax", name="act_softmax")
    x = g.reshape(x, (classes,), name="reshape_2")
    return g.model("mobilenet_%0.2f_%s" % (alpha, rows), x)


def mobilenet():
    return _mobilenet("2.2.4")


def mobilenet_21():
    return _mobilenet("2.1.6")


# ------------------------------------------------------------------ Xception (Keras 2.1.6)

def xception_reduction_block(g, x, filters1, filters2, block, relu_first=True):
    """Entry-flow blocks 2-4 and exit-flow block 13: two separable convs, a strided max
    pool, and the 1x1 strided conv shortcut (unnamed, as in Keras); BatchNormalization
    without an axis (-1) throughout, as 2.1.6 wrote it."""
    residual = g.conv2d(x, filters2, (1, 1), strides=(2, 2), padding="same", use_bias=False)
    residual = g.batch_norm(residual)
    if relu_first:
        x = g.activation(x, "relu", name=f"block{block}_sepconv1_act")
    x = g.separable_conv2d(x, filters1, (3, 3), padding="same", use_bias=False, name=f"block{block}_sepconv1")
    x = g.batch_norm(x, name=f"block{block}_sepconv1_bn")
    x = g.activation(x, "relu", name=f"block{block}_sepconv2_act")
    x = g.separable_conv2d(x, filters2, (3, 3), padding="same", use_bias=False, name=f"block{block}_sepconv2")
    x = g.batch_norm(x, name=f"block{block}_sepconv2_bn")
    x = g.max_pool(x, (3, 3), strides=(2, 2), padding="same", name=f"block{block}_pool")
    return g.add([x, residual])


def xception_middle_block(g, x, filters, block):
    residual = x
    prefix = f"block{block}"
    for i in (1, 2, 3):
        x = g.activation(x, "relu", name=f"{prefix}_sepconv{i}_act")
        x = g.separable_conv2d(x, filters, (3, 3), padding="same", use_bias=False, name=f"{prefix}_sepconv{i}")
        x = g.batch_norm(x, name=f"{prefix}_sepconv{i}_bn")
    return g.add([x, residual])


def xception():
    """Xception at widths / 16 (32, 64, 128, 256, 728, 1024, 1536, 2048 -> 2, 4, 8, 16,
    46, 64, 96, 128), one middle-flow block (block5) of the eight."""
    g = Graph("2.1.6")
    img_input = g.input((80, 80, 3))
    x = g.conv2d(img_input, 2, (3, 3), strides=(2, 2), use_bias=False, name="block1_conv1")
    x = g.batch_norm(x, name="block1_conv1_bn")
    x = g.activation(x, "relu", name="block1_conv1_act")
    x = g.conv2d(x, 4, (3, 3), use_bias=False, name="block1_conv2")
    x = g.batch_norm(x, name="block1_conv2_bn")
    x = g.activation(x, "relu", name="block1_conv2_act")

    x = xception_reduction_block(g, x, 8, 8, 2, relu_first=False)
    x = xception_reduction_block(g, x, 16, 16, 3)
    x = xception_reduction_block(g, x, 46, 46, 4)
    x = xception_middle_block(g, x, 46, 5)
    x = xception_reduction_block(g, x, 46, 64, 13)

    x = g.separable_conv2d(x, 96, (3, 3), padding="same", use_bias=False, name="block14_sepconv1")
    x = g.batch_norm(x, name="block14_sepconv1_bn")
    x = g.activation(x, "relu", name="block14_sepconv1_act")
    x = g.separable_conv2d(x, 128, (3, 3), padding="same", use_bias=False, name="block14_sepconv2")
    x = g.batch_norm(x, name="block14_sepconv2_bn")
    x = g.activation(x, "relu", name="block14_sepconv2_act")

    x = g.global_avg_pool(x, name="avg_pool")
    x = g.dense(x, 2, activation="softmax", name="predictions")
    return g.model("xception", x)


# ------------------------------------------------------------------ DenseNet121 (Keras 2.1.6)

def densenet_conv_block(g, x, growth_rate, name):
    x1 = g.batch_norm(x, axis=3, epsilon=1.001e-5, name=name + "_0_bn")
    x1 = g.activation(x1, "relu", name=name + "_0_relu")
    x1 = g.conv2d(x1, 4 * growth_rate, 1, use_bias=False, name=name + "_1_conv")
    x1 = g.batch_norm(x1, axis=3, epsilon=1.001e-5, name=name + "_1_bn")
    x1 = g.activation(x1, "relu", name=name + "_1_relu")
    x1 = g.conv2d(x1, growth_rate, 3, padding="same", use_bias=False, name=name + "_2_conv")
    return g.concatenate([x, x1], axis=3, name=name + "_concat")


def densenet_dense_block(g, x, channels, blocks, growth_rate, name):
    """Returns the block's output and its channels (Keras reads them with K.int_shape)."""
    for i in range(blocks):
        x = densenet_conv_block(g, x, growth_rate, name=f"{name}_block{i + 1}")
    return x, channels + blocks * growth_rate


def densenet_transition_block(g, x, channels, reduction, name):
    x = g.batch_norm(x, axis=3, epsilon=1.001e-5, name=name + "_bn")
    x = g.activation(x, "relu", name=name + "_relu")
    channels = int(channels * reduction)
    x = g.conv2d(x, channels, 1, use_bias=False, name=name + "_conv")
    x = g.avg_pool(x, 2, strides=2, name=name + "_pool")
    return x, channels


def densenet121(blocks=(2, 2, 2, 2), growth_rate=4):
    """DenseNet121 with growth rate 32 -> 4, stem 64 -> 8 channels, blocks [6, 12, 24, 16]
    -> [2, 2, 2, 2]. 2.1.6 ends on the BatchNormalization 'bn' (no ReLU before the pool;
    keras_applications added Activation('relu', name='relu') later)."""
    g = Graph("2.1.6")
    img_input = g.input((64, 64, 3))
    x = g.zero_pad(img_input, ((3, 3), (3, 3)))
    x = g.conv2d(x, 8, 7, strides=2, use_bias=False, name="conv1/conv")
    x = g.batch_norm(x, axis=3, epsilon=1.001e-5, name="conv1/bn")
    x = g.activation(x, "relu", name="conv1/relu")
    x = g.zero_pad(x, ((1, 1), (1, 1)))
    x = g.max_pool(x, 3, strides=2, name="pool1")
    c = 8
    x, c = densenet_dense_block(g, x, c, blocks[0], growth_rate, name="conv2")
    x, c = densenet_transition_block(g, x, c, 0.5, name="pool2")
    x, c = densenet_dense_block(g, x, c, blocks[1], growth_rate, name="conv3")
    x, c = densenet_transition_block(g, x, c, 0.5, name="pool3")
    x, c = densenet_dense_block(g, x, c, blocks[2], growth_rate, name="conv4")
    x, c = densenet_transition_block(g, x, c, 0.5, name="pool4")
    x, c = densenet_dense_block(g, x, c, blocks[3], growth_rate, name="conv5")
    x = g.batch_norm(x, axis=3, epsilon=1.001e-5, name="bn")
    x = g.global_avg_pool(x, name="avg_pool")
    x = g.dense(x, 2, activation="softmax", name="fc1000")
    return g.model("densenet121", x)


# ------------------------------------------------------------------ the newer vocabulary

def vocabulary():
    """Not an application: the layers and forms of later Keras (tf.keras, keras_contrib,
    TensorFlow Addons) that halotrain reads, in one small functional model: a stem conv
    (grouped, swish), BN, ReLU(6); a block of a (5, 3) depthwise conv (hard_sigmoid),
    squeeze-excitation with Multiply, a 1x1 projection, LayerNormalization, gelu and
    stochastic depth (Dropout with noise_shape [None, 1, 1, 1]) added to the block's
    input; ReLU(3), a (3, 2)/(2, 1) max pool, instance norm, a (1, 7) conv, group norm,
    LeakyReLU, the pooled head."""
    g = Graph("2.2.4")
    inputs = g.input((40, 36, 2))
    x = g.conv2d(inputs, 8, (3, 3), padding="same", groups=2, activation="swish", name="stem_conv")
    x = g.batch_norm(x, name="stem_bn")
    block_input = x = g.relu(x, max_value=6.0, name="stem_relu6")

    x = g.depthwise_conv2d(x, (5, 3), padding="same", activation="hard_sigmoid", name="block_dwconv")
    se = g.global_avg_pool(x, name="block_se_squeeze")
    se = g.reshape(se, (1, 1, 8), name="block_se_reshape")
    se = g.conv2d(se, 4, (1, 1), activation="swish", name="block_se_reduce")
    se = g.conv2d(se, 8, (1, 1), activation="sigmoid", name="block_se_expand")
    x = g.multiply([x, se], name="block_se_excite")
    x = g.conv2d(x, 8, (1, 1), name="block_project_conv")
    x = g.layer("LayerNormalization", x, "block_project_ln", axis=-1, epsilon=1e-3, center=True, scale=True,
                beta_initializer=zeros(), gamma_initializer=ones(), beta_regularizer=None, gamma_regularizer=None,
                beta_constraint=None, gamma_constraint=None)
    x = g.activation(x, "gelu", name="block_gelu")
    x = g.dropout(x, 0.25, noise_shape=[None, 1, 1, 1], name="block_drop")
    x = g.add([x, block_input], name="block_add")

    x = g.relu(x, max_value=3.0, name="relu3")
    x = g.max_pool(x, pool_size=(3, 2), strides=(2, 1), name="pool")
    x = g.layer("InstanceNormalization", x, "instance_norm", axis=-1, epsilon=1e-3, center=True, scale=True,
                beta_initializer=zeros(), gamma_initializer=ones(), beta_regularizer=None, gamma_regularizer=None,
                beta_constraint=None, gamma_constraint=None)
    x = g.conv2d(x, 6, (1, 7), padding="same", name="wide_conv")
    x = g.layer("Addons>GroupNormalization", x, "group_norm", groups=3, axis=-1, epsilon=1e-3, center=True,
                scale=True, beta_initializer=zeros(), gamma_initializer=ones(), beta_regularizer=None,
                gamma_regularizer=None, beta_constraint=None, gamma_constraint=None)
    x = g.leaky_relu(x, alpha=0.1, name="leaky_relu")
    x = g.global_avg_pool(x, name="avg_pool")
    x = g.dense(x, 2, activation="softmax", name="predictions")
    return g.model("vocabulary", x)


# ------------------------------------------------------------------ checks

def _out_len(n, k, s, padding, d=1):
    if n is None:
        return None
    if padding == "same":
        return -(-n // s)
    return (n - (d * (k - 1) + 1)) // s + 1


def shapes(model, input_size=None):
    """Each layer's output shape (channels last, no batch axis) followed from the input
    (its batch_input_shape, or input_size (h, w) for an open one); ValueError where a
    layer cannot take its inputs (merges of unequal maps, windows larger than the map,
    channels not divisible by groups, a Reshape of another size)."""
    out = {}
    for l in model["config"]["layers"]:
        cls, c, n = l["class_name"], l["config"], l["name"]
        ins = [out[i] for i in inbound_names(l)]
        x = ins[0] if ins else None
        if cls == "InputLayer":
            s = list(c["batch_input_shape"][1:])
            if input_size is not None:
                s[0], s[1] = input_size
            out[n] = tuple(s)
            continue
        if cls in ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "MaxPooling2D", "AveragePooling2D"):
            if len(x) != 3:
                raise ValueError(f"{n}: {cls} of a {len(x)}-d input")
            k = c.get("kernel_size", c.get("pool_size"))
            d = c.get("dilation_rate", [1, 1])
            h, w = (_out_len(x[i], k[i], c["strides"][i], c["padding"], d[i]) for i in (0, 1))
            if (h is not None and h < 1) or (w is not None and w < 1):
                raise ValueError(f"{n}: window {k} larger than the map {x[:2]}")
            ch = x[2]
            if cls == "Conv2D":
                if ch % c.get("groups", 1) or c["filters"] % c.get("groups", 1):
                    raise ValueError(f"{n}: {ch} -> {c['filters']} channels in {c.get('groups')} groups")
                ch = c["filters"]
            elif cls == "DepthwiseConv2D":
                ch *= c["depth_multiplier"]
            elif cls == "SeparableConv2D":
                ch = c["filters"]
            s = (h, w, ch)
        elif cls == "ZeroPadding2D":
            (t, b), (lf, r) = c["padding"]
            s = (None if x[0] is None else x[0] + t + b, None if x[1] is None else x[1] + lf + r, x[2])
        elif cls in ("GlobalAveragePooling2D", "GlobalMaxPooling2D"):
            s = (x[2],)
        elif cls == "Flatten":
            if None in x:
                raise ValueError(f"{n}: Flatten of an open shape {x}")
            s = (x[0] * x[1] * x[2],)
        elif cls == "Dense":
            s = x[:-1] + (c["units"],)
        elif cls == "Reshape":
            size = lambda t: 1 if not t else t[0] * size(t[1:])  # noqa: E731
            if None in x or size(x) != size(c["target_shape"]):
                raise ValueError(f"{n}: Reshape of {x} to {c['target_shape']}")
            s = tuple(c["target_shape"])
        elif cls in ("Add", "Multiply"):
            if len(ins) < 2 or len({len(i) for i in ins}) != 1:
                raise ValueError(f"{n}: {cls} of {ins}")
            s = []
            for dims in zip(*ins):
                known = {v for v in dims if v not in (None, 1)}
                if len(known) > 1:
                    raise ValueError(f"{n}: {cls} of {ins}")
                s.append(known.pop() if known else (None if None in dims else 1))
            s = tuple(s)
        elif cls == "Concatenate":
            if c["axis"] not in (-1, len(x)) or any(i[:-1] != x[:-1] for i in ins):
                raise ValueError(f"{n}: Concatenate on axis {c['axis']} of {ins}")
            s = x[:-1] + (sum(i[-1] for i in ins),)
        elif "GroupNormalization" in cls:
            if x[-1] % c["groups"]:
                raise ValueError(f"{n}: {x[-1]} channels in {c['groups']} groups")
            s = x
        elif cls in ("BatchNormalization", "Activation", "ReLU", "LeakyReLU", "Dropout", "LayerNormalization",
                     "InstanceNormalization"):
            s = x
        else:
            raise ValueError(f"{n}: no shape rule for {cls}")
        out[n] = s
    return out


def validate(model, input_size=None):
    """The model as a functional Keras 2 Model JSON: unique names, each layer's name equal
    to its config's, an InputLayer first, every inbound name an earlier layer, the input
    and output layers present, and the shapes following through (see `shapes`). Returns
    the output's shape; raises ValueError."""
    if model.get("class_name") != "Model" or model.get("backend") != "tensorflow" or "keras_version" not in model:
        raise ValueError("not a Keras functional Model")
    layers = model["config"]["layers"]
    seen = set()
    for l in layers:
        n = l["name"]
        if l["config"].get("name") != n:
            raise ValueError(f"{n}: config name {l['config'].get('name')}")
        if n in seen:
            raise ValueError(f"{n}: name used twice")
        if l["class_name"] == "InputLayer":
            if l["inbound_nodes"]:
                raise ValueError(f"{n}: an InputLayer with inbound nodes")
        elif len(l["inbound_nodes"]) != 1 or not l["inbound_nodes"][0]:
            raise ValueError(f"{n}: not one node of inbound layers")
        for i in inbound_names(l):
            if i not in seen:
                raise ValueError(f"{n}: inbound {i} is not an earlier layer")
        seen.add(n)
    if not layers or layers[0]["class_name"] != "InputLayer":
        raise ValueError("the first layer is not an InputLayer")
    for key in ("input_layers", "output_layers"):
        for ref in model["config"][key]:
            if ref[0] not in seen or ref[1:] != [0, 0]:
                raise ValueError(f"{key}: {ref}")
    by_name = {l["name"]: l for l in layers}
    if any(by_name[r[0]]["class_name"] != "InputLayer" for r in model["config"]["input_layers"]):
        raise ValueError("an input layer that is not an InputLayer")
    s = shapes(model, input_size)
    return s[model["config"]["output_layers"][0][0]]


MODELS = {
    "vgg16": (vgg16, dict(input_size=None, import_args=[])),
    "resnet50": (resnet50, dict(input_size=None, import_args=[])),
    "inception_v3": (inception_v3, dict(input_size=(139, 139), import_args=["--input-size", "139,139"])),
    "mobilenet": (mobilenet, dict(input_size=None, import_args=[])),
    "mobilenet_21": (mobilenet_21, dict(input_size=None, import_args=[])),
    "xception": (xception, dict(input_size=None, import_args=[])),
    "densenet121": (densenet121, dict(input_size=None, import_args=[])),
    "vocabulary": (vocabulary, dict(input_size=None, import_args=[])),
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else None
    for name, (builder, info) in MODELS.items():
        model = builder()
        shape = validate(model, info["input_size"])
        layers = model["config"]["layers"]
        print(f"{name}: Keras {model['keras_version']}, {len(layers)} layers, "
              f"input {layers[0]['config']['batch_input_shape']}, output {shape}")
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
                json.dump(model, f)


if __name__ == "__main__":
    main()
