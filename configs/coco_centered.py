# MS COCO 2014 (81 classes), converted by tools/convert_coco.py: the paper's model with the settings of ToCo's
# released COCO training, rulixiang/ToCo at e13514d scripts/dist_train_coco_seg_neg.py (argparse defaults and the
# loss schedule in its loop), where they differ from its VOC script (the defaults of wsss/config/schema.py):
#   --high_thre 0.65 (VOC 0.7)        -> cam.fg_thresh
#   --bkg_thre 0.45 (VOC 0.5)         -> cam.infer_bg_thresh
#   seg/reg losses off while n_iter <= 8000 (VOC 2000) -> loss.seg_start_iter = 8001
#   --max_iters 80000, --eval_iters 4000 -> train.max_iters (the default), train.val_interval
#   --train_set train, --val_set val_part (the first 5,000 of the sorted val ids; --val_part is the full val)
# Not carried over: ToCo's COCO loop takes its pseudo labels from the aux CAM until iteration 12000 and adds its
# own PTC/CTC losses; wsss has neither (docs/reference.md).
data = dict(
    root="data/coco",
    image_dir=".",
    classes="classes.txt",
    train_split="train",
    val_split="val_part",
    mask_dir="SegmentationClass",
    label_file="cls_labels.json",
)
model = dict(attention=dict(name="centered"))
cam = dict(fg_thresh=0.65, infer_bg_thresh=0.45)
loss = dict(seg_start_iter=8001)
train = dict(max_iters=80000, val_interval=4000, ckpt_interval=4000)
work_dir = "work_dirs/coco_centered"
