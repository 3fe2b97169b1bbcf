# Your own images with image-level tags and no masks (README "Train on your own tagged images"). data.root is the
# image folder (any nesting); tags.csv in it lists each image's path relative to it and its tags (`image,tags`,
# tags separated by ',', ';' or spaces), or tags.json maps path -> [tags]. The classes are taken from that file, a
# fixed 10 % of the images (by a hash of the path) is held out for validation, which reports classification mAP
# and F1 and CAM pictures (segmentation mIoU needs masks). The model is the paper's (DeiT-S, centered attention,
# ImageNet weights from timm), trained for ToCo's VOC length of 20k iterations instead of 80k.
data = dict(
    layout="tags",
    root="data/my_images",
    image_dir=".",
    label_file="tags.csv",
    classes=None,
    train_split="train",
    val_split="val",
    val_fraction=0.1,
)
model = dict(attention=dict(name="centered"))
train = dict(max_iters=20000, val_interval=2000, ckpt_interval=2000)
work_dir = "work_dirs/tagged_centered"
