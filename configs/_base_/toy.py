# The generated toy dataset (python tools/make_toy_voc.py data/toy_voc): 6 shape classes, 400 train / 100 val.
data = dict(
    root="data/toy_voc",
    classes="classes.txt",
    train_split="train",
    val_split="val",
    mask_dir="SegmentationClass",
    label_file="cls_labels.json",
    crop_size=160,
    scale_range=(0.75, 1.25),
    color_jitter_prob=0.3,
    grayscale_prob=0.0,
    num_workers=1,
)
