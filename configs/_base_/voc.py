# PASCAL VOC 2012 + SBD (train_aug, 10,582 images), evaluated on val (1,449). See data/README.md.
data = dict(
    root="data/VOCdevkit/VOC2012",
    train_split="train_aug",
    val_split="val",
    mask_dir="SegmentationClassAug",
    label_file="cls_labels.json",
    crop_size=448,
    scale_range=(0.5, 2.0),
)
