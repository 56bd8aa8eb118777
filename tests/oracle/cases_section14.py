"""Oracle cases of SPEC section 14 (fine-tuning): frozen layers (`trainable: false`, and
training.freeze released at unfreeze_at), Keras's class_weight on labels, class maps and
masks, and torch's BCEWithLogitsLoss(pos_weight). oracle.py runs each like its own cases; a
case's `training` keys go into the config's training section and into the reference (torch
with requires_grad False and batch norm in eval mode for what is frozen). Class weights are
exact in float32, so the kernels and torch weigh with the same numbers.
"""

ADAM = dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4)
SGD = dict(type="sgd", lr=0.05, momentum=0.9)

STEM = [
    dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
    dict(type="batch_norm", momentum=0.9),
    dict(type="relu"),
]

CASES = {
    # The fine-tuning recipe: a frozen stem (its batch norm on its moving statistics), a
    # block frozen for two steps and then trained (Adam's step count for it starts at 1 at
    # step 3), a head that trains throughout.
    "frozen_backbone_adam": dict(
        input=[34, 30, 1], loss="softmax_cross_entropy", classes=2, optimizer=ADAM,
        training=dict(freeze=["block_*"], unfreeze_at=2),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False, name="stem", trainable=False),
            dict(type="batch_norm", momentum=0.9, name="stem_bn", trainable=False),
            dict(type="relu"),
            dict(type="conv2d", filters=6, kernel=3, stride=2, padding="same", bias=False, name="block_conv"),
            dict(type="batch_norm", momentum=0.9, name="block_bn"),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=5, kernel=3, padding="same", name="head_conv"),
            dict(type="relu"),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2, name="head"),
        ],
        grids=[[1, 1], [2, 2], [3, 2]],
        mpi=[(4, [2, 2])],
    ),
    # A frozen conv between layers that train (the gradient passes through it), an encoder
    # released after the first step, SGD's momentum starting with it.
    "freeze_unfreeze_sgd": dict(
        input=[30, 27, 1], loss="sigmoid_bce", masks=True, optimizer=SGD,
        training=dict(freeze=["enc*"], unfreeze_at=1),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False, name="enc_conv"),
            dict(type="batch_norm", momentum=0.9, name="enc_bn"),
            dict(type="relu"),
            dict(type="conv2d", filters=4, kernel=3, padding="same", name="mid", trainable=False),
            dict(type="relu"),
            dict(type="separable_conv2d", filters=3, kernel=3, padding="same", name="dec"),
            dict(type="relu"),
            dict(type="conv2d", filters=1, kernel=1, name="out"),
        ],
        grids=[[1, 1], [2, 2], [1, 3]],
        mpi=[(3, [3, 1])],
    ),
    # A rare class weighed up, as screening data asks: each image's loss times its label's weight.
    "class_weights_adam": dict(
        input=[33, 27, 1], loss="softmax_cross_entropy", classes=3, optimizer=ADAM,
        training=dict(class_weights=[0.5, 3.0, 1.25]),
        layers=STEM + [
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=5, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="global_avg_pool"),
            dict(type="dense", units=3),
        ],
        grids=[[1, 1], [2, 2], [3, 1]],
        mpi=[(4, [2, 2])],
    ),
    # Per pixel of a class map.
    "class_map_weights_sgd": dict(
        input=[30, 26, 2], loss="softmax_cross_entropy", masks=True, classes=3, optimizer=SGD,
        training=dict(class_weights=[0.25, 2.0, 4.5]),
        layers=STEM + [
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [1, 3]],
        mpi=[(4, [2, 2])],
    ),
    # Per pixel of a mask: class weights and pos_weight together.
    "mask_pos_weight_sgd": dict(
        input=[31, 28, 1], loss="sigmoid_bce", masks=True, optimizer=SGD,
        training=dict(class_weights=[0.75, 2.0], pos_weight=3.5),
        layers=STEM + [
            dict(type="conv2d", filters=1, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2]],
        mpi=[(4, [2, 2])],
    ),
}
